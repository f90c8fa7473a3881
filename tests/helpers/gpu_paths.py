"""The two kernel paths of a Hopper GPU, for the CUDA kernel tests.

On compute capability 9.0 the library runs its sm_90a kernels where they apply and the sm_80 kernels elsewhere;
OMNI_HF_DISABLE_SM90=1 (read by the library at every call) sends everything to sm_80. The ``kernel_path`` fixture
(tests/cuda/conftest.py) runs each test that uses it on both paths there, and once elsewhere.
"""

from __future__ import annotations

import torch

from omni_hf.ops import library


def is_hopper() -> bool:
    """True on a compute capability 9.0 GPU with the library."""
    return library.available() and torch.cuda.get_device_capability() == (9, 0)


def kernel_names(fn, pattern: str) -> list[str]:
    """Names of the CUDA kernels containing `pattern` that fn() launches."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if pattern in e.name]
