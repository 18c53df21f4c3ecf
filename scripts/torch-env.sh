#!/usr/bin/env bash
# Creates the venv with torch, transformers, TRL and PEFT in which tests check what
# forgelog hands to the PyTorch ecosystem: an exported model's logits under
# transformers' own forward (tests/python/hf_model_check.py) and a TRL
# SFTTrainer step on an SFT export (tests/python/trl_sft_step.py), a LoRA
# adapter under PEFT (tests/python/peft_adapter_check.py).
# ${FORGELOG_HOME:-$HOME/.cache/forgelog}/venv-torch. Idempotent; versions pinned.
#
# Apart from scripts/python-env.sh because it is big (PyPI's Linux torch wheel
# brings its CUDA libraries: about 6 GB installed, 2 min cold) and only the
# tests need it: scripts/test.sh runs this, scripts/setup.sh does not.
set -euo pipefail
FORGELOG_HOME=${FORGELOG_HOME:-$HOME/.cache/forgelog}
VENV="$FORGELOG_HOME/venv-torch"
PINS=(torch==2.14.1 trl==1.16.0 accelerate==1.15.0 transformers==5.24.0 tokenizers==0.23.3
      datasets==5.2.0 safetensors==0.8.0 peft==0.21.2)

if [ ! -x "$VENV/bin/python3" ]; then
  python3 -m venv "$VENV"
fi
installed=$("$VENV/bin/python3" -m pip freeze 2>/dev/null || true)
for pin in "${PINS[@]}"; do
  if ! grep -qixF "$pin" <<<"$installed"; then
    t0=$SECONDS
    "$VENV/bin/python3" -m pip install --quiet --disable-pip-version-check "${PINS[@]}"
    echo "setup: torch venv installed in $((SECONDS - t0)) s" >&2
    break
  fi
done
echo "setup: torch venv ready at $VENV (${PINS[*]})" >&2
