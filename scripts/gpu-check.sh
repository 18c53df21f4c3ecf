#!/usr/bin/env bash
# On an NVIDIA machine, with gpu-bin/ from scripts/gpu-build.sh (built
# elsewhere: no Rust toolchain is needed here, and nothing is fetched): the
# learner's correctness checks on the GPU, the engine's sampling rate, and
# learner steps in bf16 and f32, full and LoRA, on random weights of Qwen3
# shapes. Prints tokens/s, step time, model TFLOP/s, MFU against
# FORGELOG_GPU_PEAK_BF16 / _F32 (TFLOP/s; NVIDIA's H200 sheet by default) and
# each run's peak GPU memory (nvidia-smi, sampled every 100 ms). Each run's
# log goes to FORGELOG_GPU_LOGS (default /tmp/gpu-check); each is bounded
# (FORGELOG_GPU_RUN_TIMEOUT seconds) so one hang cannot eat a lease.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${FORGELOG_GPU_LOGS:-/tmp/gpu-check}
mkdir -p "$out"
bf16_peak=${FORGELOG_GPU_PEAK_BF16:-989}
f32_peak=${FORGELOG_GPU_PEAK_F32:-67}
if [ ! -x gpu-bin/trainer-bench ] && [ -f gpu-bin.tar.xz ]; then
  # Python's lzma where no xz is installed.
  tar -xJf gpu-bin.tar.xz 2>/dev/null ||
    python3 -c 'import lzma, sys, tarfile; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall()' gpu-bin.tar.xz
fi
[ -x gpu-bin/trainer-bench ] || { echo "gpu-check: no gpu-bin/ (run scripts/gpu-build.sh where cargo is)" >&2; exit 1; }

# CUDA 13's libraries as a PyTorch install brings them (nvidia/cu13/lib), else
# the system's; the driver's libcuda.so.1 from the loader's paths or where
# container runtimes mount the driver (/usr/local/nvidia).
wheels=$(python3 -c 'import nvidia, os; print(":".join(os.path.join(p, "cu13", "lib") for p in nvidia.__path__))' 2>/dev/null || true)
export LD_LIBRARY_PATH=${wheels:+$wheels:}/usr/local/cuda/lib64:/usr/local/nvidia/lib64:/usr/local/nvidia/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader
if ldd gpu-bin/trainer-bench | grep 'not found'; then
  echo "gpu-check: libraries missing (above); LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >&2
  exit 1
fi

# measure NAME COMMAND...: runs it bounded, logs it, and says its exit
# status, wall time and peak GPU memory.
measure() {
  local name=$1
  shift
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$out/$name.mem" 2>/dev/null &
  local smi=$! start=$SECONDS
  timeout "${FORGELOG_GPU_RUN_TIMEOUT:-240}" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  kill "$smi" 2>/dev/null
  wait "$smi" 2>/dev/null
  grep -E '^(test result|model|batch|prompt|step|peak|checkpoint|  [0-9]+ steps)|FAILED|panicked|Error' "$out/$name.log" | head -40
  echo "== $name: exit $rc in $((SECONDS - start)) s, peak GPU memory $(sort -n "$out/$name.mem" | tail -1) MiB"
}

export FORGELOG_TRAINER_TEST_DEVICE=cuda
measure learner-tests gpu-bin/learner-tests --test-threads 1
train=(gpu-bin/trainer-bench --device cuda --no-checkpoint --steps 3)
measure train-qwen3-0.6b-bf16 "${train[@]}" --shape qwen3-0.6b --dtype bf16 --peak-tflops "$bf16_peak" --sequences 16 --prompt 448 --sampled 64
measure engine-qwen3-0.6b-f32 gpu-bin/engine-bench --device cuda --shape qwen3-0.6b --tokens 32 --batches 1,16,64
measure train-qwen3-0.6b-f32 "${train[@]}" --shape qwen3-0.6b --dtype f32 --peak-tflops "$f32_peak" --sequences 16 --prompt 448 --sampled 64
measure train-qwen3-8b-bf16-lora16 "${train[@]}" --shape qwen3-8b --dtype bf16 --lora 16 --peak-tflops "$bf16_peak" --sequences 8 --prompt 448 --sampled 64
measure train-qwen3-4b-bf16 "${train[@]}" --shape qwen3-4b --dtype bf16 --peak-tflops "$bf16_peak" --sequences 8 --prompt 448 --sampled 64
# Four times the tokens a step: how much of a step is fixed cost.
measure train-qwen3-0.6b-bf16-x4 "${train[@]}" --shape qwen3-0.6b --dtype bf16 --peak-tflops "$bf16_peak" --sequences 64 --prompt 448 --sampled 64
measure train-qwen3-8b-bf16-lora16-x4 "${train[@]}" --shape qwen3-8b --dtype bf16 --lora 16 --peak-tflops "$bf16_peak" --sequences 32 --prompt 448 --sampled 64
