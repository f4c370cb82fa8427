#!/usr/bin/env bash
# The prepared run for a lent CUDA GPU (under ten minutes on an H200; each part has a time limit), from the repository root:
#   OUT=results_folder bash benchmarks/gpu_checks.sh
# 1. the tests that need CUDA or compile the Triton kernels for it (kernels against their torch references, DART
#    end to end with them, FlexAttention training gradients against the dense mask);
# 2. kernel and verify-step timings (benchmarks/bench_kernels_gpu.py, Qwen3-8B-shaped random weights, bfloat16);
# 3. the decode loop on CUDA (benchmarks/gpu_decode_check.py: identity with vanilla in float32, near-ties in the
#    default dtype, device-clock timings, calibrated tree costs);
# 4. training throughput with FlexAttention and with the dense mask (benchmarks/bench_training.py).
# Each part has its own time limit, so one that hangs leaves the others' results.
set -u
OUT=${OUT:-gpu_results}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
$python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__,
'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
timeout 150 $python -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_hardware.py \
    "tests/test_training.py::test_flex_gradients_equal_dense_gradients_on_cuda" 2>&1 | tee "$OUT/tests.log"
timeout 100 $python benchmarks/bench_kernels_gpu.py --out "$OUT/kernels_gpu.json" 2>&1 | tail -40
timeout 150 $python benchmarks/gpu_decode_check.py --out "$OUT/gpu_decode_check.json" 2>&1 | tail -40
for attention in flex dense; do
    timeout 60 $python benchmarks/bench_training.py --device cuda --attention $attention --batch-size 16 \
        --out "$OUT/training_$attention.json" 2>&1 | tail -25
done
