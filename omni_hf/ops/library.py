"""Find, build and load the CUDA library (``libomni_hf_cuda.so``), and run its ops on torch tensors.

The library registers the ops ``omni_hf::fwd``, ``omni_hf::bwd`` and ``omni_hf::token_mask`` with PyTorch through
torch's stable C ABI (``csrc/host/torch_ops.cpp``), so a call is one dispatch, graph capture works, and one binary
serves every torch from 2.10 on. This module loads it, registers the ops' fake implementations (for
``torch.compile``) and exposes what `omni_hf.ops.attention` dispatches to. It takes flat tensors and ints only (a
mask as `omni_hf.mask.OmniBlockMask.as_tuple` gives it), never the mask class:

- `available()`: a CUDA device is present and the library loads (never raises);
- `unsupported_reason(q, mask_sizes)`: None when the kernels can run such a call, else a short reason;
- `forward(q, k, v, mask_tensors, mask_sizes, scale, softcap) -> (out, lse)`;
- `backward(dout, q, k, v, out, lse, mask_tensors, mask_sizes, scale, softcap) -> (dq, dk, dv)`;
- `token_mask(...)`: `OmniBlockMask.from_token_ids`'s lists and token ranges in four launches.

Outputs follow their input's memory layout: where q is a transposed ``[B, S, H, D]`` tensor (what Transformers
hands over), out and dq are too, so transposing them back costs no copy (`output_strides`).

Library lookup order: ``$OMNI_HF_CUDA_LIB`` (a path to the .so), ``omni_hf/lib/`` (built by
``python3 -m pip install``, also an editable one), then a cache directory (``$OMNI_HF_CACHE`` or ``~/.cache/omni_hf/<hash of sources and flags>/``)
where the first use builds it for the current GPU when nvcc is present, printing progress to stderr.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from .. import build as _build

__all__ = ["available", "unsupported_reason", "kernel_head_dim", "forward", "backward", "token_mask",
           "output_strides", "set_poison_outputs"]

ABI_VERSION = 6  # OMNI_ABI_VERSION of csrc/include/omni_attention.h
HEAD_DIMS = (64, 96, 128, 256)  # the kernels' instantiations (csrc/generate_instantiations.py's table), ascending
# Shared memory per block that the sm_80 backward needs above head dim 128 (64-key tiles of 256 columns, Q and dO
# double-buffered): Hopper grants it, an A100 (163 KB) does not.
_WIDE_BACKWARD_SMEM = 209 * 1024
BLOCK_SIZES = (64, 128)
# Parts of a mask's flat tensors (`OmniBlockMask.as_tuple`): the row view, the column view, then the pattern pool,
# doc ids, group ids and token ranges.
ROW_VIEW, COLUMN_VIEW, SHARED = slice(0, 4), slice(4, 8), slice(8, 12)
_DTYPES = (torch.float16, torch.bfloat16)
_MAX_GRID_YZ = 65535


class LibraryError(RuntimeError):
    """The CUDA library cannot be found, built or loaded."""


# ---------------------------------------------------------------------- finding, building, loading


def _device_archs() -> tuple[str, ...]:
    """The nvcc target for the current GPU: sm_90a on Hopper, sm_80 (which also runs on 8.x) otherwise."""
    major, _ = torch.cuda.get_device_capability()
    return ("90a",) if major == 9 else ("80",)


def _cache_dir(archs: tuple[str, ...]) -> Path:
    root = os.environ.get("OMNI_HF_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "omni_hf"
    return base / _build.source_hash(archs)


def _build_into_cache() -> Path:
    """Builds the library for the current GPU into the cache directory (once; a file lock serialises
    concurrent first uses) and returns its path."""
    if _build.find_nvcc() is None:
        raise LibraryError("no prebuilt library (install omni_hf from a wheel, or `python3 -m pip install` it where "
                           "nvcc is present, or set OMNI_HF_CUDA_LIB) and nvcc is not available to build one")
    if not _build.CSRC.is_dir():
        raise LibraryError(f"no prebuilt library and no CUDA sources at {_build.CSRC} to build one")
    archs = _device_archs()
    out = _cache_dir(archs)
    out.mkdir(parents=True, exist_ok=True)
    lib = out / _build.LIB_NAME
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not lib.is_file():
            print(f"omni_hf: building the CUDA kernels into {out} (first use)", file=sys.stderr)
            try:
                _build.build(out, archs)
            except _build.BuildError as err:
                raise LibraryError(str(err)) from err
    return lib


def packaged_library() -> Path:
    """Where an install (regular or editable) puts the library: ``omni_hf/lib/libomni_hf_cuda.so``."""
    return Path(__file__).resolve().parent.parent / "lib" / _build.LIB_NAME


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
def _library() -> ctypes.CDLL:
    """Loads the library once per process (registering its ops) and returns its C entry points; raises
    LibraryError."""
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
    _register_fakes()
    return lib


@functools.lru_cache(maxsize=1)
def _load_error() -> str | None:
    """Why the library is unusable on this machine, or None; computed once."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        _library()
    except LibraryError as err:
        return f"CUDA library unavailable: {err}"
    return None


def available() -> bool:
    """True when a CUDA device is present and the library loads (building it on first use). Never raises."""
    try:
        return _load_error() is None
    except Exception:  # noqa: BLE001 - the contract is to answer, never to raise
        return False


def set_poison_outputs(on: bool) -> None:
    """Test hook: when on, the ops fill their outputs with NaN before the kernels write them, so that a test
    comparing every element proves that every element was written."""
    _library().omni_set_poison_outputs(int(on))


# ---------------------------------------------------------------------- what the kernels take


_REASONS: dict[tuple, str | None] = {}


@torch.compiler.assume_constant_result  # Dynamo calls it while tracing, rather than tracing into the library load
def _call_reason(device_index: int, dtype: torch.dtype, head_dim: int, block_q: int, block_kv: int) -> str | None:
    """Why the kernels cannot run such a call, or None; answered once per distinct call (a dict, not lru_cache,
    which Dynamo would unwrap and trace)."""
    key = device_index, dtype, head_dim, block_q, block_kv
    if key not in _REASONS:
        _REASONS[key] = _reason(*key)
    return _REASONS[key]


def _reason(device_index: int, dtype: torch.dtype, head_dim: int, block_q: int, block_kv: int) -> str | None:
    if dtype not in _DTYPES:
        return f"dtype {dtype} (kernels take float16 and bfloat16)"
    if kernel_head_dim(head_dim) is None:
        return f"head dim {head_dim} (kernels take head dims up to {HEAD_DIMS[-1]})"
    if block_q not in BLOCK_SIZES or block_kv not in BLOCK_SIZES:
        return f"block sizes {block_q}x{block_kv} (kernels take 64 and 128)"
    if torch.cuda.get_device_capability(device_index)[0] < 8:
        return "compute capability below 8.0"
    if kernel_head_dim(head_dim) > 128 and _smem_per_block(device_index) < _WIDE_BACKWARD_SMEM:
        return (f"head dim {head_dim}: its backward needs {_WIDE_BACKWARD_SMEM // 1024} KB of shared memory per "
                f"block, this GPU grants {_smem_per_block(device_index) // 1024} KB")
    return _load_error()


def _smem_per_block(device_index: int) -> int:
    """The shared memory one block may opt into on the device, in bytes."""
    props = torch.cuda.get_device_properties(device_index)
    known = {(8, 0): 163 * 1024, (9, 0): 227 * 1024}  # where torch does not report it
    return getattr(props, "shared_memory_per_block_optin", None) or known.get((props.major, props.minor), 99 * 1024)


def kernel_head_dim(head_dim: int) -> int | None:
    """The instantiated head dim whose kernels run calls of ``head_dim``: itself, or the next larger one, whose loads
    read the columns past ``head_dim`` as zeros (every score and output stays exact) and whose stores skip them;
    None above the largest."""
    return next((d for d in HEAD_DIMS if d >= head_dim), None)


def unsupported_reason(q: torch.Tensor, mask_sizes: Sequence[int]) -> str | None:
    """None when the CUDA kernels can run attention of ``q`` (checked against k and v by the caller) with a mask of
    ``mask_sizes`` (`OmniBlockMask.as_tuple`'s), else a short human reason. Any strides are accepted: the op copies
    what its loads cannot read."""
    q_len, _, block_q, block_kv, _, _ = mask_sizes
    if not q.is_cuda:
        return "tensors not on a CUDA device"
    if -(-q_len // block_q) > _MAX_GRID_YZ or q.shape[0] > _MAX_GRID_YZ:
        return "too many query blocks or batch rows for one launch"
    return _call_reason(q.get_device(), q.dtype, q.shape[-1], block_q, block_kv)


# ---------------------------------------------------------------------- the ops


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask_tensors: Sequence[torch.Tensor | None],
            mask_sizes: Sequence[int], scale: float, softcap: float | None,
            sinks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention forward on the GPU (``omni_hf::fwd``).

    Args:
        q: ``[B, Hq, Sq, D]``; k, v: ``[B, Hkv, Skv, D]``; fp16 / bf16, any strides.
        mask_tensors, mask_sizes: the mask as `OmniBlockMask.as_tuple` flattens it, on q's device (or implicit).
        scale: multiplies q.k; softcap: None or 0 for none, else > 0.
        sinks: None, or float32 ``[Hq]`` contiguous on q's device: each query head's sink logit, which joins every
            row's softmax denominator and takes no value.
    Returns:
        out ``[B, Hq, Sq, D]`` in q's dtype and layout (`output_strides`) and lse float32 ``[B, Hq, Sq]``
        (the sink included; -inf on empty rows without a sink).
    """
    num, indices, types, partial = mask_tensors[ROW_VIEW]
    pool, doc, grp, ranges = mask_tensors[SHARED]
    _, _, block_q, block_kv, window, kind = mask_sizes
    return torch.ops.omni_hf.fwd.default(q, k, v, num, indices, types, partial, pool, doc, grp, ranges, kind,
                                         block_q, block_kv, window, scale, softcap or 0.0, sinks)


def backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
             lse: torch.Tensor, mask_tensors: Sequence[torch.Tensor | None], mask_sizes: Sequence[int], scale: float,
             softcap: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention backward on the GPU (``omni_hf::bwd``) from the forward's out and lse; the mask as in `forward`.

    Returns:
        dq ``[B, Hq, Sq, D]``, dk and dv ``[B, Hkv, Skv, D]``, each in its input's dtype and layout.
    """
    num, indices, types, partial = mask_tensors[COLUMN_VIEW]
    pool, doc, grp, ranges = mask_tensors[SHARED]
    _, _, block_q, block_kv, window, kind = mask_sizes
    return torch.ops.omni_hf.bwd.default(dout, q, k, v, out, lse, num, indices, types, partial, pool, doc, grp, ranges,
                                         kind, block_q, block_kv, window, scale, softcap or 0.0)


def token_mask(doc_ids: torch.Tensor, group_ids: torch.Tensor, q_len: int, block_q: int, block_kv: int,
               window: int | None) -> list[torch.Tensor]:
    """The row and column views and the token ranges of `OmniBlockMask.from_token_ids`, built by the library (no
    host sync).

    Args:
        doc_ids, group_ids: int32 ``[B, kv_len]`` contiguous, on one CUDA device (checked by the caller).
        q_len: at most kv_len; block_q, block_kv: 64 or 128; window: None or > 0.
    Returns:
        kv_num_blocks, kv_indices, kv_types, kv_partial, q_num_blocks, q_indices, q_types, q_partial with
        mask heads 1, and token_ranges ``[B, kv_len, 4]``: byte for byte what the PyTorch build gives.
    """
    return list(torch.ops.omni_hf.token_mask.default(doc_ids, group_ids, q_len, block_q, block_kv, window or 0))


# ---------------------------------------------------------------------- fake implementations (torch.compile)


def output_strides(t: torch.Tensor) -> tuple[int, ...]:
    """Strides of the op's output for input ``t`` ``[B, H, S, D]``: ``[B, S, H, D]`` order when ``t`` is that
    layout transposed (``t.stride(1) == D`` and ``t.stride(2) == H * D``, as Transformers hands q), else
    contiguous. Mirrors ``output_strides`` in csrc/host/torch_ops.cpp."""
    batch, heads, seq, dim = t.shape
    if t.stride(1) == dim and t.stride(2) == heads * dim and t.stride(3) == 1:
        return seq * heads * dim, dim, heads * dim, 1
    return heads * seq * dim, seq * dim, dim, 1


def _like(t: torch.Tensor) -> torch.Tensor:
    return t.new_empty_strided(t.shape, output_strides(t))


def _register_fakes() -> None:
    """Shapes, dtypes and strides of the ops' outputs, for tracing; registered once the library defines them."""

    @torch.library.register_fake("omni_hf::fwd")
    def _(q, k, v, num, indices, types, partial, pool, doc, grp, ranges, kind, block_q, block_kv, window, scale,
          softcap, sinks):
        return _like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)

    @torch.library.register_fake("omni_hf::bwd")
    def _(dout, q, k, v, out, lse, num, indices, types, partial, pool, doc, grp, ranges, kind, block_q, block_kv,
          window, scale, softcap):
        return _like(q), _like(k), _like(v)

    @torch.library.register_fake("omni_hf::token_mask")
    def _(doc, grp, q_len, block_q, block_kv, window):
        batch, kv_len = doc.shape
        num_q, num_kv = -(-q_len // block_q), -(-kv_len // block_kv)

        def lists(rows, cols):
            shape = (batch, 1, rows, cols)
            return [doc.new_empty(shape[:3]), doc.new_empty(shape), doc.new_empty(shape, dtype=torch.int8),
                    doc.new_empty(shape)]

        return (*lists(num_q, num_kv), *lists(num_kv, num_q), doc.new_empty((batch, kv_len, 4)))
