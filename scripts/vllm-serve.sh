#!/usr/bin/env bash
# Serves a model folder with the CPU vLLM of scripts/vllm-env.sh, as the tests
# start it (tests/support/vllm.rs): f32, 8,192 tokens, processed logprobs,
# the RL routes (pause, reload_weights, weight version) and runtime LoRA.
#   scripts/vllm-serve.sh MODEL_DIR [PORT] [more vllm serve flags]
# Runs in the foreground; its name for the model is `smollm2`.
set -euo pipefail
dir=${1:?usage: vllm-serve.sh MODEL_DIR [PORT]}
port=${2:-8000}
shift $(($# < 2 ? $# : 2))
FORGELOG_HOME=${FORGELOG_HOME:-$HOME/.cache/forgelog}
export VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 OMP_NUM_THREADS=1 VLLM_NO_USAGE_STATS=1 \
  HF_HUB_OFFLINE=1 VLLM_SERVER_DEV_MODE=1 VLLM_ALLOW_RUNTIME_LORA_UPDATING=1
exec "$FORGELOG_HOME/vllm-venv/bin/vllm" serve "$dir" --dtype float32 --max-model-len 8192 \
  --logprobs-mode processed_logprobs --served-model-name smollm2 \
  --host 127.0.0.1 --port "$port" --enable-lora --max-lora-rank 16 "$@"
