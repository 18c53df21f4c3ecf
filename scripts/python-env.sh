#!/usr/bin/env bash
# Creates the Python venv the proxy's integration tests drive the official SDKs
# from: ${FORGELOG_HOME:-$HOME/.cache/forgelog}/venv. Idempotent; versions pinned.
set -euo pipefail
FORGELOG_HOME=${FORGELOG_HOME:-$HOME/.cache/forgelog}
VENV="$FORGELOG_HOME/venv"
# moto[server]: the S3-compatible server of the export test; datasets: the export loads with HF datasets;
# fastavro: the log read outside forgelog (schemas/python); transformers, tokenizers, safetensors:
# exported model folders read as Hugging Face reads them (no torch: tests/python/hf_model_check.py).
PINS=(openai==3.51.0 anthropic==2.10.0 "moto[server]==5.2.5" datasets==5.2.0 fastavro==1.13.1
      transformers==5.24.0 tokenizers==0.23.3 safetensors==0.8.0)

if [ ! -x "$VENV/bin/python3" ]; then
  python3 -m venv "$VENV"
fi
installed=$("$VENV/bin/python3" -m pip freeze 2>/dev/null || true)
for pin in "${PINS[@]}"; do
  # `moto[server]==5.2.5` is frozen as `moto==5.2.5`
  if ! grep -qixF "${pin/\[*\]/}" <<<"$installed"; then
    "$VENV/bin/python3" -m pip install --quiet --disable-pip-version-check "${PINS[@]}"
    break
  fi
done
# harbor: its ATIF models (harbor.models.trajectories, pydantic only) check `export atif`.
# The package asks for Python 3.12 and a server's worth of dependencies those models
# do not import, so it goes in alone.
HARBOR=harbor==0.26.0
if ! grep -qixF "$HARBOR" <<<"$installed"; then
  "$VENV/bin/python3" -m pip install --quiet --disable-pip-version-check --no-deps --ignore-requires-python "$HARBOR"
fi
echo "setup: python venv ready at $VENV (${PINS[*]} $HARBOR)" >&2
