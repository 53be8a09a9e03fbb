#!/usr/bin/env bash
# The GPU checks of docs/gpu.md, on a machine with JAX and PyTorch (CUDA) and no TensorFlow:
# the backend tests with CUDA against TensorFlow's CPU outputs, then the backend benchmarks
# and the decode step under jax.jit.
#
#   python tests/backends/tensorflow_results.py RESULTS.npz   # where TensorFlow is (CPU)
#   bash benchmarks/gpu.sh RESULTS.npz OUT                # on the GPU machine
#
# Each step writes OUT/<step> and has its own time limit, so a slow step leaves the others.
set -u
results=$(realpath "$1")
out=$2
mkdir -p "$out"
cd "$(dirname "$0")/.."
# Several JAX processes share the GPU: none takes 75% of its memory up front.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD/tests:$PWD${PYTHONPATH:+:$PYTHONPATH}"
tests=(python3 -m pytest tests/backends --noconftest -q -p no:cacheprovider -rf --tb=line
  --deselect tests/backends/test_symbolic_export.py::test_keras_export_serves_a_dynamic_sequence_on_tensorflow)

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  KERAS_BACKEND=jax python3 -c "import sys, jax, torch, keras; print(sys.version.split()[0], 'jax', jax.__version__,
  jax.devices(), 'torch', torch.__version__, torch.cuda.get_device_name(), 'keras', keras.__version__)"
} >"$out/device.txt" 2>&1

# Correctness: every backend test, jax (default and float32 matmuls) and torch, at once.
KERAS_BACKEND=jax POSENC_TF_RESULTS=$results timeout 420 "${tests[@]}" >"$out/tests_jax.txt" 2>&1 &
KERAS_BACKEND=jax JAX_DEFAULT_MATMUL_PRECISION=highest POSENC_TF_RESULTS=$results \
  timeout 420 "${tests[@]}" -k attention >"$out/tests_jax_highest.txt" 2>&1 &
KERAS_BACKEND=torch POSENC_TF_RESULTS=$results timeout 420 "${tests[@]}" >"$out/tests_torch.txt" 2>&1 &
{ for backend in jax torch; do
    KERAS_BACKEND=$backend timeout 300 python3 tests/backends/without_tensorflow.py
  done; } >"$out/without_tensorflow.txt" 2>&1 &
wait

# Speed, one step at a time (each alone on the GPU).
KERAS_BACKEND=jax timeout 240 python3 -m benchmarks --backend jax --rounds 7 >"$out/benchmark_jax.md" 2>&1
KERAS_BACKEND=torch timeout 150 python3 -m benchmarks --backend torch --rounds 7 >"$out/benchmark_torch.md" 2>&1
timeout 200 python3 -m benchmarks.jax_decode --rounds 15 >"$out/decode_jax.md" 2>&1
tail -n 3 "$out"/*
