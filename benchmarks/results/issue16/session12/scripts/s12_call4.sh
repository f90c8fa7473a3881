#!/bin/bash
# session 12, call 4: dQ by red.global.add.v4.f32 from registers (.carry/red): GPU tests, A/B against fafc10d's library
export PYTHONPATH=$PWD OMNI_HF_CUDA_LIB=$PWD/.carry/red/libomni_hf_cuda.so
nvidia-smi -L
timeout 150 python3 -m pytest -q -W ignore -p no:cacheprovider tests/test_cuda_backward.py tests/test_cuda_graphs.py > $OUT/gpu_tests_bwd.log 2>&1; echo "tests rc=$?"; tail -2 $OUT/gpu_tests_bwd.log
timeout 200 python3 benchmarks/results/issue16/session10/kernel_ab.py base=.carry/libomni_hf_cuda.so red=.carry/red/libomni_hf_cuda.so --pass bwd --rounds 4 > $OUT/red_ab.log 2>&1; echo "ab rc=$?"
cat $OUT/red_ab.log
