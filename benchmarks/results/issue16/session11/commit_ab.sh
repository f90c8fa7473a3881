#!/bin/bash
# A/B across commits: session 10's tree and library (9c7c681, in .carry/s10) against this tree's, kernel_ab.py's
# child mode of each tree (CUDA-graph kernel time), alternating for $2 rounds; pass $1 (fwd|bwd).
which=$1; rounds=$2
for r in $(seq $rounds); do
  for side in s10 new; do
    if [ $side = s10 ]; then root=$PWD/.carry/s10; else root=$PWD; fi
    (cd $root && PYTHONPATH=$root OMNI_HF_CUDA_LIB=$root/$( [ $side = s10 ] && echo libomni_hf_cuda.so || echo .carry/libomni_hf_cuda.so ) \
      python3 benchmarks/results/issue16/session10/kernel_ab.py --child --pass $which x=y | tail -1 | sed "s/^/$side $r /")
  done
done
