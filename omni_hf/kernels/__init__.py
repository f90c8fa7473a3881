"""The CUDA library ``libomni_hf_cuda.so``, the layer under both `omni_hf.mask` and `omni_hf.ops`: it imports neither.

Modules: `table` (the values C++ and Python share, generated from csrc/generate_instantiations.py's table),
`devices` (which GPUs run which kernels: compute capability, shared memory, build targets), `loader` (find, build
and load the library; `available`), `fakes` (the ops' fake implementations for ``torch.compile``, and the layout of
their outputs), `token_mask` (the GPU builder of token-rule masks). The attention ops' wrappers live in
`omni_hf.ops.library`; the build itself in `omni_hf.build`.
"""
