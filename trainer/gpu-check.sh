#!/usr/bin/env bash
# On an NVIDIA machine: build the learner with CUDA, run its correctness
# checks (tests) and the training bench on the GPU, in one go.
# The CUDA toolkit may come from PyPI: pip install nvidia-cuda-nvcc-cu12 (and
# nvidia-cuda-runtime-cu12); this script finds nvcc there when none is on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/forgelog/target}
if ! command -v nvcc >/dev/null; then
  nvcc=$(python3 -c 'import nvidia.cuda_nvcc, os; print(os.path.join(list(nvidia.cuda_nvcc.__path__)[0], "bin", "nvcc"))' 2>/dev/null || true)
  if [ -z "$nvcc" ] || [ ! -x "$nvcc" ]; then
    echo "no nvcc: install the CUDA toolkit or 'pip install nvidia-cuda-nvcc-cu12 nvidia-cuda-runtime-cu12'" >&2
    exit 1
  fi
  export CUDA_ROOT=$(dirname "$(dirname "$nvcc")") PATH=$(dirname "$nvcc"):$PATH
  export LD_LIBRARY_PATH=$CUDA_ROOT/lib:${LD_LIBRARY_PATH:-}
fi
nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv,noheader
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)}
[ -f "${FORGELOG_MODEL_GGUF:-$HOME/.cache/forgelog/models/SmolLM2-135M-Instruct.Q4_1.gguf}" ] || scripts/fetch-model.sh
# The correctness checks (gradient check, on-policy ratios, staleness) with the CUDA build.
FORGELOG_TRAINER_TEST_DEVICE=cuda cargo test --release -p forgelog-trainer --features cuda --lib --test learner -- --nocapture
# Throughput on the GPU, f32 and bf16, at the default batch and a larger one.
for dtype in f32 bf16; do
  cargo run --release -p forgelog-trainer --features cuda --example trainer-bench -- --device cuda --dtype "$dtype"
  cargo run --release -p forgelog-trainer --features cuda --example trainer-bench -- --device cuda --dtype "$dtype" --sequences 64 --prompt 448 --sampled 64
done
# The closed loop on the GPU: `up --demo --train` with the engine and the
# learner on cuda; the report's tok/s column is the engine's sampling rate
# per version, and the driver prints the seconds per training step.
cargo build --release --features cuda --bin forgelog
loop_home=$(mktemp -d)
"$CARGO_TARGET_DIR/release/forgelog" up --demo --train --steps "${FORGELOG_GPU_LOOP_STEPS:-5}" \
  --device cuda --home "$loop_home" --export-to "$loop_home/export" \
  --engine-listen 127.0.0.1:18000 --proxy-listen 127.0.0.1:18100 \
  | grep -E "tok/s|^ +[0-9?]+ |^round |seconds per training step|^reward first"
