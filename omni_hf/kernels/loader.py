"""Find, build and load the CUDA library (``libomni_hf_cuda.so``), which registers the ops ``omni_hf::fwd``,
``omni_hf::bwd`` and ``omni_hf::token_mask`` with PyTorch through torch's stable C ABI (``csrc/host/torch_ops.cpp``).

Lookup order: ``$OMNI_HF_CUDA_LIB`` (a path to the .so), ``omni_hf/lib/`` (built by ``python3 -m pip install``, also
an editable one), then a cache directory (``$OMNI_HF_CACHE`` or ``~/.cache/omni_hf/``, then a hash of sources and
flags) where the first use builds it for the current GPU when nvcc is present, printing progress to stderr.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import sys
from pathlib import Path

import torch

from . import devices, fakes

__all__ = ["ABI_VERSION", "LibraryError", "available", "library", "library_path", "load_error",
           "set_poison_outputs"]

ABI_VERSION = 9  # OMNI_ABI_VERSION of csrc/include/omni_attention.h


class LibraryError(RuntimeError):
    """The CUDA library cannot be found, built or loaded."""


def _builder():
    """`omni_hf.build`, imported where first needed: ``python -m omni_hf.build`` imports the package before it runs
    the module, and a build module the package had imported by then would be run a second time (runpy warns)."""
    from .. import build

    return build


def _cache_dir(targets: tuple[str, ...]) -> Path:
    root = os.environ.get("OMNI_HF_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "omni_hf"
    return base / _builder().source_hash(targets)


def _build_into_cache() -> Path:
    """Builds the library for the current GPU into the cache directory (once; a file lock serialises
    concurrent first uses) and returns its path."""
    build = _builder()
    if build.find_nvcc() is None:
        raise LibraryError("no prebuilt library (install omni_hf from a wheel, or `python3 -m pip install` it where "
                           "nvcc is present, or set OMNI_HF_CUDA_LIB) and nvcc is not available to build one")
    if not build.CSRC.is_dir():
        raise LibraryError(f"no prebuilt library and no CUDA sources at {build.CSRC} to build one")
    targets = devices.device_targets(torch.cuda.get_device_capability())
    out = _cache_dir(targets)
    out.mkdir(parents=True, exist_ok=True)
    lib = out / build.LIB_NAME
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not lib.is_file():
            print(f"omni_hf: building the CUDA kernels into {out} (first use)", file=sys.stderr)
            try:
                build.build(out, targets)
            except build.BuildError as err:
                raise LibraryError(str(err)) from err
    return lib


def packaged_library() -> Path:
    """Where an install (regular or editable) puts the library: ``omni_hf/lib/libomni_hf_cuda.so``."""
    return Path(__file__).resolve().parent.parent / "lib" / _builder().LIB_NAME


def library_path() -> Path:
    """The library this process loads: ``$OMNI_HF_CUDA_LIB``, the packaged one, else the cache's (built there on
    first use)."""
    env = os.environ.get("OMNI_HF_CUDA_LIB")
    if env:
        if not Path(env).is_file():
            raise LibraryError(f"OMNI_HF_CUDA_LIB={env} does not exist")
        return Path(env)
    if packaged_library().is_file():
        return packaged_library()
    return _build_into_cache()


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """Loads the library once per process (registering its ops and their fakes) and returns its C entry points;
    raises LibraryError."""
    path = library_path()
    try:
        torch.ops.load_library(str(path))
        lib = ctypes.CDLL(str(path))
    except OSError as err:
        raise LibraryError(f"cannot load {path}: {err}") from err
    version = lib.omni_abi_version()
    if version != ABI_VERSION:
        raise LibraryError(f"{path} has ABI version {version}, this omni_hf expects {ABI_VERSION}; rebuild it "
                           "(python -m omni_hf.build)")
    fakes.register_fakes()
    return lib


@functools.lru_cache(maxsize=1)
def load_error() -> str | None:
    """Why the library is unusable on this machine (no GPU, a GPU below compute capability 8.0, or a library that
    cannot be found, built or loaded), or None; computed once."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    reason = devices.capability_reason(torch.cuda.get_device_capability())
    if reason is not None:
        return reason
    try:
        library()
    except LibraryError as err:
        return f"CUDA library unavailable: {err}"
    return None


def available() -> bool:
    """True when a CUDA device is present and the library loads (building it on first use). Never raises."""
    try:
        return load_error() is None
    except Exception:  # noqa: BLE001 - the contract is to answer, never to raise
        return False


def set_poison_outputs(on: bool) -> None:
    """Test hook: when on, the ops fill their outputs with NaN before the kernels write them, so that a test
    comparing every element proves that every element was written."""
    library().omni_set_poison_outputs(int(on))
