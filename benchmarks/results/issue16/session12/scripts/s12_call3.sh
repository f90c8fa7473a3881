#!/bin/bash
# session 12, call 3: the dQ writer warp (.carry/dqw): GPU tests, A/B against fafc10d's library, sanitizers
export PYTHONPATH=$PWD OMNI_HF_CUDA_LIB=$PWD/.carry/dqw/libomni_hf_cuda.so
nvidia-smi -L
timeout 150 python3 -m pytest -q -W ignore -p no:cacheprovider tests/test_cuda_backward.py tests/test_cuda_graphs.py > $OUT/gpu_tests_bwd.log 2>&1; echo "tests rc=$?"; tail -2 $OUT/gpu_tests_bwd.log
timeout 200 python3 benchmarks/results/issue16/session10/kernel_ab.py base=.carry/libomni_hf_cuda.so dqw=.carry/dqw/libomni_hf_cuda.so --pass bwd --rounds 4 > $OUT/dqw_ab.log 2>&1; echo "ab rc=$?"
ONE="import sys; sys.path.insert(0, 'tests'); import test_cuda_backward as t; t.test_fully_masked_rows_and_unseen_keys_get_exactly_zero_gradient(128); t.test_implicit_causal_mask_gradients(128, 128, 200, 1031, None); print('ok')"
ALL="import sys; sys.path.insert(0, 'tests'); import test_cuda_backward as t; t.test_fully_masked_rows_and_unseen_keys_get_exactly_zero_gradient(128); t.test_implicit_causal_mask_gradients(128, 128, 200, 1031, None); t.test_token_ranges_give_the_gradients_of_the_ids(200); print('ok')"
timeout 100 compute-sanitizer --tool memcheck --kernel-name kns=sm90 python3 -c "$ALL" > $OUT/sanitize_bwd_memcheck.log 2>&1; echo "bwd memcheck rc=$?"; tail -1 $OUT/sanitize_bwd_memcheck.log
timeout 150 compute-sanitizer --tool racecheck --kernel-name kns=sm90 python3 -c "$ONE" > $OUT/sanitize_bwd_racecheck.log 2>&1; echo "bwd racecheck rc=$?"; tail -1 $OUT/sanitize_bwd_racecheck.log
cat $OUT/dqw_ab.log
