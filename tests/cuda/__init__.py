"""The CUDA library: its build, kernels (forward, backward, decoding), head dims and CUDA graphs."""
