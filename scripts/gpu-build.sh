#!/usr/bin/env bash
# Builds, on a machine with no GPU and no CUDA toolkit, what a lent GPU
# machine runs (scripts/gpu-check.sh): the engine and learner benches and the
# learner's correctness tests with candle's CUDA kernels, for one compute
# capability (CUDA_COMPUTE_CAP, default 90: H100/H200), stripped into
# gpu-bin/ and packed into gpu-bin.tar.xz (both ignored by git): about 70 MB
# a binary (candle links every quantized kernel's machine code), 14 MB packed,
# to travel within the 64 MiB a lent machine takes.
#
# The toolkit comes from PyPI (nvcc, headers, cuBLAS, cuRAND, NVRTC of CUDA
# 13.0, the lent machine's) into a venv; the NVIDIA driver is not needed to
# build: the binaries link against a stand-in libcuda.so.1 made here from
# cudarc's list of driver functions, and the real driver answers at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
FORGELOG_HOME=${FORGELOG_HOME:-$HOME/.cache/forgelog}
CUDA_VERSION=${FORGELOG_CUDA_VERSION:-13.0}
venv=${FORGELOG_CUDA_VENV:-$FORGELOG_HOME/cuda-$CUDA_VERSION}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "nvidia-cuda-nvcc==$CUDA_VERSION.*" "nvidia-cuda-runtime==$CUDA_VERSION.*" \
    "nvidia-cuda-nvrtc==$CUDA_VERSION.*" "nvidia-cuda-crt==$CUDA_VERSION.*" "nvidia-nvvm==$CUDA_VERSION.*" \
    "nvidia-cuda-cccl==$CUDA_VERSION.*" "nvidia-cublas==$CUDA_VERSION.*" nvidia-curand
fi
cuda=$(echo "$venv"/lib/python3*/site-packages/nvidia/cu13)
[ -x "$cuda/bin/nvcc" ] || { echo "gpu-build: no nvcc in $cuda" >&2; exit 1; }

# The link-time libraries: unversioned names, and the driver's stand-in.
cargo fetch -q
cudarc=$(ls -d "$HOME"/.cargo/registry/src/*/cudarc-"$(grep -A1 '^name = "cudarc"' Cargo.lock | sed -n 's/version = "\(.*\)"/\1/p')")
for lib in cublas cublasLt nvrtc cudart; do ln -sf "lib$lib.so.13" "$cuda/lib/lib$lib.so"; done
ln -sf libcurand.so.10 "$cuda/lib/libcurand.so"
grep -o '^pub unsafe fn cu[A-Za-z0-9_]*' "$cudarc/src/driver/sys/mod.rs" | sed 's/pub unsafe fn //' | sort -u \
  | sed 's/.*/int &(void) { return 999; }/' >"$cuda/lib/cuda-stand-in.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$cuda/lib/libcuda.so" "$cuda/lib/cuda-stand-in.c"

export CUDA_ROOT=$cuda CUDA_PATH=$cuda PATH=$cuda/bin:$PATH LD_LIBRARY_PATH=$cuda/lib
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
export CARGO_TARGET_DIR=${FORGELOG_CUDA_TARGET_DIR:-$FORGELOG_HOME/target-cuda}
features=forgelog-trainer/cuda,forgelog-engine/cuda
cargo build --release -p forgelog-trainer -p forgelog-engine --features "$features" \
  --example trainer-bench --example engine-bench
tests=$(cargo test --release -p forgelog-trainer --features forgelog-trainer/cuda --test learner --no-run \
  --message-format=json 2>/dev/null | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)

rm -rf gpu-bin && mkdir gpu-bin
for bin in "$CARGO_TARGET_DIR/release/examples/trainer-bench" "$CARGO_TARGET_DIR/release/examples/engine-bench"; do
  strip -o "gpu-bin/$(basename "$bin")" "$bin"
done
strip -o gpu-bin/learner-tests "$tests"
# The three share most of their bytes: one archive with a window wider than
# a binary keeps them once.
tar -cf - gpu-bin | xz -T2 -9e --lzma2=preset=9e,dict=192MiB >gpu-bin.tar.xz
echo "gpu-bin/ for sm_$CUDA_COMPUTE_CAP (CUDA $CUDA_VERSION):" >&2
du -sh gpu-bin/* gpu-bin.tar.xz >&2
