#!/usr/bin/env bash
# One GPU machine's checks, logs under $OUT (default build/gpu_check, which git ignores): the library loads with
# this torch, the GPU tests pass, compute-sanitizer finds nothing on small cases, and (optionally) benchmarks run.
#
#   OMNI_HF_CUDA_LIB=/path/libomni_hf_cuda.so bash benchmarks/gpu_check.sh [tests|sanitize|launch|decode|suite]...
#
# With no step named it runs tests, sanitize and launch. Each step's log is $OUT/<step>.log; the script stops at
# the first failing step. OMNI_HF_TESTS overrides the test files of the tests step.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # omni_hf for the scripts under tests/
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests sanitize launch)

python3 - <<'EOF' 2>&1 | tee "$OUT/environment.log" || exit 1
import torch, transformers
from omni_hf.kernels import loader
print(torch.cuda.get_device_name(), "torch", torch.__version__, "transformers", transformers.__version__)
print("library", loader.library_path(), "available", loader.available(), loader.load_error())
assert loader.available()
EOF

run() {  # run STEP COMMAND...: log to $OUT/STEP.log, stop on failure
  local step=$1; shift
  echo "== $step: $*"
  local start=$SECONDS
  "$@" > "$OUT/$step.log" 2>&1
  local status=$?
  tail -n 25 "$OUT/$step.log"
  echo "== $step: exit $status after $((SECONDS - start)) s"
  [ $status -eq 0 ] || exit $status
}

for step in "${steps[@]}"; do
  case $step in
    tests) run tests python3 -m pytest -q --maxfail=5 -p no:cacheprovider ${OMNI_HF_TESTS:-\
             tests/cuda/test_cuda_forward.py tests/cuda/test_cuda_backward.py tests/cuda/test_cuda_decode.py \
             tests/cuda/test_cuda_graphs.py tests/cuda/test_cuda_differential.py tests/mask/test_mask.py \
             tests/ops/test_ops.py tests/integrations/test_transformers_integration.py tests/cuda/test_head_dims.py} ;;
    sanitize) run sanitize bash -c 'for tool in memcheck racecheck; do
                 compute-sanitizer --tool $tool --kernel-name kns=omni python3 -m tests.cuda.sanitize_forward || exit 1
                 compute-sanitizer --tool $tool --kernel-name kns=omni python3 -m tests.cuda.test_cuda_backward \
                   || exit 1
                 compute-sanitizer --tool $tool --kernel-name kns=omni python3 -m tests.cuda.sanitize_backward || exit 1
                 OMNI_HF_DISABLE_SM90=1 compute-sanitizer --tool $tool --kernel-name kns=omni \
                   python3 -m tests.cuda.sanitize_backward 64 512 || exit 1
                 compute-sanitizer --tool $tool --kernel-name kns=omni python3 -m pytest -q -p no:cacheprovider \
                   tests/cuda/test_head_dims.py -k "matches and bf16 and 256 and (blocks128 or vlm)" || exit 1
               done' ;;
    launch) run launch python3 -m benchmarks.bench_launch --out "$OUT" ;;
    decode) run decode python3 -m benchmarks.bench_decode --out "$OUT" ;;
    suite) run suite python3 -m benchmarks.run --shapes small --rounds 5 --out "$OUT" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
