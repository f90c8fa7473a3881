#!/bin/bash
# session 12, call 2: timing-only variants of the sm_90a backward (bf16 D128): warpgroups decoupled (dec), no dQ
# at all (nodq), dQ GEMM without its write (nored); against fafc10d's library
export PYTHONPATH=$PWD
nvidia-smi -L
timeout 400 python3 benchmarks/results/issue16/session10/kernel_ab.py base=.carry/libomni_hf_cuda.so dec=.carry/dec/libomni_hf_cuda.so nodq=.carry/nodq/libomni_hf_cuda.so nored=.carry/nored/libomni_hf_cuda.so --pass bwd --rounds 3 > $OUT/timing_variants_ab.log 2>&1; echo "ab rc=$?"
cat $OUT/timing_variants_ab.log
