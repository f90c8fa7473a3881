"""Find, build and load the CUDA library (``libomni_hf_cuda.so``) through ctypes, and run it on torch tensors.

The library has a plain C ABI (``csrc/omni_attention.h``); this module mirrors its structs, checks its ABI
version and exposes what `omni_hf.ops` dispatches to:

- `available()`: a CUDA device is present and the library loads (never raises);
- `unsupported_reason(q, k, v, mask)`: None when the kernels can run these inputs, else a short reason;
- `forward(q, k, v, mask, scale, softcap) -> (out, lse)`;
- `backward(dout, q, k, v, out, lse, mask, scale, softcap) -> (dq, dk, dv)`;
- `builds_token_masks()` and `token_mask_lists(...)`: `OmniBlockMask.from_token_ids`'s lists in two launches.

Library lookup order: ``$OMNI_HF_CUDA_LIB`` (a path to the .so), ``omni_hf/lib/`` (built by ``pip install``),
then a cache directory (``$OMNI_HF_CACHE`` or ``~/.cache/omni_hf/<hash of sources and flags>/``) where the
first use builds it for the current GPU when nvcc is present, printing progress to stderr.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import sys
from pathlib import Path

import torch

from . import build as _build
from .mask import OmniBlockMask

__all__ = ["available", "unsupported_reason", "forward", "backward", "builds_token_masks", "token_mask_lists"]

ABI_VERSION = 1
HEAD_DIMS = (64, 128)
BLOCK_SIZES = (64, 128)
_DTYPES = {torch.float16: 0, torch.bfloat16: 1}
_VECTOR_ELEMS = 8  # 16 bytes of fp16 / bf16
_MAX_GRID_YZ = 65535

# Test hook: when True, `forward` and `backward` fill their outputs with NaN before the kernels write them,
# so a test comparing every element proves that every element was written.
poison_outputs = False


# ---------------------------------------------------------------------- ctypes mirror of omni_attention.h


class OmniTensor(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("stride_b", ctypes.c_int64), ("stride_h", ctypes.c_int64),
                ("stride_s", ctypes.c_int64)]


class OmniBlockList(ctypes.Structure):
    _fields_ = [("num_blocks", ctypes.c_void_p), ("indices", ctypes.c_void_p), ("types", ctypes.c_void_p),
                ("partial", ctypes.c_void_p), ("stride_b", ctypes.c_int64), ("stride_h", ctypes.c_int64),
                ("num_rows", ctypes.c_int32), ("max_blocks", ctypes.c_int32)]


class OmniMask(ctypes.Structure):
    _fields_ = [("kv", OmniBlockList), ("q", OmniBlockList), ("partial_pool", ctypes.c_void_p),
                ("num_partial", ctypes.c_int32), ("doc_ids", ctypes.c_void_p), ("group_ids", ctypes.c_void_p),
                ("ids_stride_b", ctypes.c_int64), ("window", ctypes.c_int32), ("block_q", ctypes.c_int32),
                ("block_kv", ctypes.c_int32), ("heads", ctypes.c_int32)]


class OmniFwdParams(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int32), ("batch", ctypes.c_int32), ("heads_q", ctypes.c_int32),
                ("heads_kv", ctypes.c_int32), ("q_len", ctypes.c_int32), ("kv_len", ctypes.c_int32),
                ("head_dim", ctypes.c_int32), ("scale", ctypes.c_float), ("softcap", ctypes.c_float),
                ("q", OmniTensor), ("k", OmniTensor), ("v", OmniTensor), ("out", OmniTensor),
                ("lse", ctypes.c_void_p), ("mask", OmniMask), ("stream", ctypes.c_void_p)]


class OmniBlockListOut(ctypes.Structure):
    _fields_ = [("num_blocks", ctypes.c_void_p), ("indices", ctypes.c_void_p), ("types", ctypes.c_void_p),
                ("partial", ctypes.c_void_p)]


class OmniTokenMaskParams(ctypes.Structure):
    _fields_ = [("doc_ids", ctypes.c_void_p), ("group_ids", ctypes.c_void_p), ("batch", ctypes.c_int32),
                ("q_len", ctypes.c_int32), ("kv_len", ctypes.c_int32), ("block_q", ctypes.c_int32),
                ("block_kv", ctypes.c_int32), ("window", ctypes.c_int32), ("kv", OmniBlockListOut),
                ("q", OmniBlockListOut), ("workspace", ctypes.c_void_p), ("stream", ctypes.c_void_p)]


_TOKEN_SUMMARY_INTS = 6  # OMNI_TOKEN_SUMMARY_INTS


class OmniBwdParams(ctypes.Structure):
    _fields_ = [("fwd", OmniFwdParams), ("dout", OmniTensor), ("dq", OmniTensor), ("dk", OmniTensor),
                ("dv", OmniTensor), ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_size_t)]


# ---------------------------------------------------------------------- finding, building, loading


class LibraryError(RuntimeError):
    """The CUDA library cannot be found, built or loaded."""


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
        raise LibraryError("no prebuilt library (set OMNI_HF_CUDA_LIB or `pip install` with nvcc) and nvcc is "
                           "not available to build one")
    if not _build.CSRC.is_dir():
        raise LibraryError(f"no prebuilt library and no CUDA sources at {_build.CSRC} to build one")
    archs = _device_archs()
    out = _cache_dir(archs)
    out.mkdir(parents=True, exist_ok=True)
    lib = out / _build.LIB_NAME
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not lib.is_file():
            print(f"omni_hf: building the CUDA kernels into {out} (first use; takes a few minutes)",
                  file=sys.stderr)
            try:
                _build.build(out, archs)
            except _build.BuildError as err:
                raise LibraryError(str(err)) from err
    return lib


def _library_path() -> Path:
    env = os.environ.get("OMNI_HF_CUDA_LIB")
    if env:
        if not Path(env).is_file():
            raise LibraryError(f"OMNI_HF_CUDA_LIB={env} does not exist")
        return Path(env)
    packaged = Path(__file__).resolve().parent / "lib" / _build.LIB_NAME
    if packaged.is_file():
        return packaged
    return _build_into_cache()


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.omni_abi_version.restype = ctypes.c_int
    lib.omni_fwd.argtypes = [ctypes.POINTER(OmniFwdParams)]
    lib.omni_fwd.restype = ctypes.c_int
    lib.omni_bwd_workspace_bytes.argtypes = [ctypes.POINTER(OmniBwdParams)]
    lib.omni_bwd_workspace_bytes.restype = ctypes.c_size_t
    lib.omni_bwd.argtypes = [ctypes.POINTER(OmniBwdParams)]
    lib.omni_bwd.restype = ctypes.c_int
    if hasattr(lib, "omni_build_token_mask"):  # libraries built before it was added lack it
        lib.omni_build_token_mask.argtypes = [ctypes.POINTER(OmniTokenMaskParams)]
        lib.omni_build_token_mask.restype = ctypes.c_int
    lib.omni_error_string.argtypes = [ctypes.c_int]
    lib.omni_error_string.restype = ctypes.c_char_p
    lib.omni_last_error_detail.restype = ctypes.c_char_p
    return lib


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    """The loaded library (found or built once per process); raises LibraryError."""
    path = _library_path()
    try:
        lib = _declare(ctypes.CDLL(str(path)))
    except OSError as err:
        raise LibraryError(f"cannot load {path}: {err}") from err
    version = lib.omni_abi_version()
    if version != ABI_VERSION:
        raise LibraryError(f"{path} has ABI version {version}, this omni_hf expects {ABI_VERSION}; rebuild it "
                           "(python -m omni_hf.build)")
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


# ---------------------------------------------------------------------- argument checks


def _strides(t: torch.Tensor) -> tuple[int, ...]:
    """Strides of a [B, H, S, D] tensor with size-1 dims reported as 0 (they are never stepped)."""
    return tuple(0 if size == 1 else stride for size, stride in zip(t.shape, t.stride()))


def _layout_reason(name: str, t: torch.Tensor) -> str | None:
    if t.stride(-1) != 1 and t.shape[-1] != 1:
        return f"{name}: last dim not contiguous (strides {tuple(t.stride())})"
    if t.data_ptr() % 16:
        return f"{name}: data pointer not 16-byte aligned"
    if any(s % _VECTOR_ELEMS for s in _strides(t)[:3]):
        return f"{name}: strides {tuple(t.stride())} not multiples of 8 elements (16 bytes)"
    return None


@functools.lru_cache(maxsize=None)
def _major_capability(index: int) -> int:
    """Compute capability major of CUDA device `index` (a tensor's device always has one); looked up once."""
    return torch.cuda.get_device_capability(index)[0]


def unsupported_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: OmniBlockMask) -> str | None:
    """None when the CUDA kernels can run these inputs, else a short human reason."""
    if not (q.is_cuda and k.is_cuda and v.is_cuda):
        return "tensors not on a CUDA device"
    if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtype {q.dtype} (kernels take float16 and bfloat16)"
    if q.shape[-1] not in HEAD_DIMS or k.shape[-1] != q.shape[-1] or v.shape[-1] != q.shape[-1]:
        return f"head dim {q.shape[-1]} (kernels take {', '.join(map(str, HEAD_DIMS))})"
    if mask.block_q not in BLOCK_SIZES or mask.block_kv not in BLOCK_SIZES:
        return f"block sizes {mask.block_q}x{mask.block_kv} (kernels take 64 and 128)"
    if _major_capability(q.device.index) < 8:
        return "compute capability below 8.0"
    for name, t in (("q", q), ("k", k), ("v", v)):
        reason = _layout_reason(name, t)
        if reason:
            return reason
    if -(-mask.q_len // mask.block_q) > _MAX_GRID_YZ or q.shape[0] > _MAX_GRID_YZ:
        return "too many query blocks or batch rows for one launch"
    return _load_error()


# ---------------------------------------------------------------------- struct filling


def _tensor(t: torch.Tensor) -> OmniTensor:
    stride_b, stride_h, stride_s, _ = _strides(t)
    return OmniTensor(t.data_ptr(), stride_b, stride_h, stride_s)


def _block_list(num: torch.Tensor, indices: torch.Tensor, types: torch.Tensor, partial: torch.Tensor,
                keep: list[torch.Tensor]) -> OmniBlockList:
    """The C view of one block-list view; tensors it had to convert are appended to `keep`."""
    num = num.contiguous()
    lists = [indices.to(torch.int32).contiguous(), types.to(torch.int8).contiguous(),
             partial.to(torch.int32).contiguous()]
    keep.extend([num, *lists])
    batch, heads, rows = num.shape
    return OmniBlockList(num.data_ptr(), lists[0].data_ptr(), lists[1].data_ptr(), lists[2].data_ptr(),
                         0 if batch == 1 else heads * rows, 0 if heads == 1 else rows, rows, indices.shape[-1])


def _mask(mask: OmniBlockMask, keep: list[torch.Tensor]) -> OmniMask:
    pool = mask.partial_pool.to(torch.int32).contiguous()
    doc, grp = (None if t is None else t.to(torch.int32).contiguous() for t in (mask.doc_ids, mask.group_ids))
    keep.extend(t for t in (pool, doc, grp) if t is not None)
    ids = doc if doc is not None else grp
    return OmniMask(
        kv=_block_list(mask.kv_num_blocks, mask.kv_indices, mask.kv_types, mask.kv_partial, keep),
        q=_block_list(mask.q_num_blocks, mask.q_indices, mask.q_types, mask.q_partial, keep),
        partial_pool=pool.data_ptr() if pool.numel() else None, num_partial=pool.shape[0],
        doc_ids=doc.data_ptr() if doc is not None else None, group_ids=grp.data_ptr() if grp is not None else None,
        ids_stride_b=0 if ids is None or ids.shape[0] == 1 else ids.stride(0), window=mask.window or 0,
        block_q=mask.block_q, block_kv=mask.block_kv, heads=mask.heads,
    )


def _fwd_params(q, k, v, out, lse, mask, scale, softcap, keep) -> OmniFwdParams:
    batch, heads_q, q_len, dim = q.shape
    return OmniFwdParams(
        dtype=_DTYPES[q.dtype], batch=batch, heads_q=heads_q, heads_kv=k.shape[1], q_len=q_len, kv_len=k.shape[2],
        head_dim=dim, scale=scale, softcap=softcap or 0.0, q=_tensor(q), k=_tensor(k), v=_tensor(v),
        out=_tensor(out), lse=lse.data_ptr(), mask=_mask(mask, keep),
        stream=torch.cuda.current_stream(q.device).cuda_stream,
    )


def _check(lib: ctypes.CDLL, status: int, entry: str) -> None:
    if status != 0:
        what = lib.omni_error_string(status).decode()
        detail = lib.omni_last_error_detail().decode()
        raise RuntimeError(f"{entry} failed: {what}: {detail}")


# ---------------------------------------------------------------------- entry points


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: OmniBlockMask, scale: float,
            softcap: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention forward on the GPU.

    Args:
        q: ``[B, Hq, Sq, D]``; k, v: ``[B, Hkv, Skv, D]``; fp16 / bf16, last dim contiguous, any other strides.
        mask: an `OmniBlockMask` on q's device; scale multiplies q.k; softcap: None or > 0.
    Returns:
        out ``[B, Hq, Sq, D]`` (contiguous, q's dtype) and lse float32 ``[B, Hq, Sq]`` (-inf on empty rows).
    """
    lib = _library()
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    if poison_outputs:
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
    keep: list[torch.Tensor] = []
    params = _fwd_params(q, k, v, out, lse, mask, scale, softcap, keep)
    with torch.cuda.device(q.device):
        _check(lib, lib.omni_fwd(ctypes.byref(params)), "omni_fwd")
    return out, lse


def backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
             lse: torch.Tensor, mask: OmniBlockMask, scale: float, softcap: float | None,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention backward on the GPU from the forward's out and lse.

    Args:
        dout: ``[B, Hq, Sq, D]`` gradient of out (copied only if its layout is not 16-byte aligned);
        q, k, v, mask, scale, softcap: the forward's inputs; out, lse: its outputs.
    Returns:
        dq ``[B, Hq, Sq, D]``, dk and dv ``[B, Hkv, Skv, D]``, contiguous, in q's dtype.
    """
    lib = _library()
    if _layout_reason("dout", dout):
        dout = dout.contiguous()
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    if poison_outputs:
        for grad in (dq, dk, dv):
            grad.fill_(float("nan"))
    keep: list[torch.Tensor] = [lse.contiguous()]
    params = OmniBwdParams(fwd=_fwd_params(q, k, v, out, keep[0], mask, scale, softcap, keep),
                           dout=_tensor(dout), dq=_tensor(dq), dk=_tensor(dk), dv=_tensor(dv))
    with torch.cuda.device(q.device):
        size = lib.omni_bwd_workspace_bytes(ctypes.byref(params))
        workspace = torch.empty(max(size, 1), dtype=torch.uint8, device=q.device)
        params.workspace, params.workspace_bytes = workspace.data_ptr(), size
        _check(lib, lib.omni_bwd(ctypes.byref(params)), "omni_bwd")
    return dq, dk, dv


def builds_token_masks() -> bool:
    """True when the library loads here and has ``omni_build_token_mask``. Never raises."""
    return available() and hasattr(_library(), "omni_build_token_mask")


def _list_outputs(batch: int, rows: int, cols: int, device: torch.device) -> list[torch.Tensor]:
    """Empty num int32 ``[B, 1, rows]``, indices int32, types int8 and pool ids int32 ``[B, 1, rows, cols]``."""
    shape = (batch, 1, rows, cols)
    return [torch.empty(shape[:3], dtype=torch.int32, device=device),
            torch.empty(shape, dtype=torch.int32, device=device), torch.empty(shape, dtype=torch.int8, device=device),
            torch.empty(shape, dtype=torch.int32, device=device)]


def token_mask_lists(doc_ids: torch.Tensor, group_ids: torch.Tensor, q_len: int, block_q: int, block_kv: int,
                     window: int | None) -> list[torch.Tensor]:
    """The row and column views of `OmniBlockMask.from_token_ids`, built by the library (no host sync).

    Args:
        doc_ids, group_ids: int32 ``[B, kv_len]`` contiguous, on one CUDA device (checked by the caller).
        q_len: at most kv_len; block_q, block_kv: 64 or 128; window: None or > 0.
    Returns:
        kv_num_blocks, kv_indices, kv_types, kv_partial, q_num_blocks, q_indices, q_types, q_partial with
        mask heads 1, byte for byte what the PyTorch build gives.
    """
    lib = _library()
    batch, kv_len = doc_ids.shape
    num_q, num_kv = -(-q_len // block_q), -(-kv_len // block_kv)
    row, col = _list_outputs(batch, num_q, num_kv, doc_ids.device), _list_outputs(batch, num_kv, num_q, doc_ids.device)
    workspace = torch.empty(_TOKEN_SUMMARY_INTS * batch * (num_q + num_kv), dtype=torch.int32, device=doc_ids.device)
    params = OmniTokenMaskParams(
        doc_ids=doc_ids.data_ptr(), group_ids=group_ids.data_ptr(), batch=batch, q_len=q_len, kv_len=kv_len,
        block_q=block_q, block_kv=block_kv, window=window or 0,
        kv=OmniBlockListOut(*(t.data_ptr() for t in row)), q=OmniBlockListOut(*(t.data_ptr() for t in col)),
        workspace=workspace.data_ptr(), stream=torch.cuda.current_stream(doc_ids.device).cuda_stream,
    )
    with torch.cuda.device(doc_ids.device):
        _check(lib, lib.omni_build_token_mask(ctypes.byref(params)), "omni_build_token_mask")
    return row + col
