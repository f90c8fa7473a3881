"""The implementations compared, each as ``fn(q, k, v) -> out`` over ``[B, H, S, D]`` tensors.

- ``omni``: `omni_hf.omni_attention` with omni's own mask (one entry per omni block size; with
  ``--omni-sm80`` also ``omni b128 sm80``, its sm_80 kernels forced, forward and backward, where the Hopper
  kernels would run);
- ``flex``: ``torch.compile(flex_attention)`` with a ``create_block_mask`` of the layout's ``mask_mod``
  (GQA through ``enable_gqa``);
- ``flex-flash``: the same call with ``kernel_options={"BACKEND": "FLASH"}``, Flex's experimental backend that
  runs FlashAttention-4's CuTe-DSL kernels (``flash_attn.cute``; `benchmarks/flash_setup.sh` installs them);
  skipped where there is no CUDA device or ``flash_attn.cute`` does not import, and where the backend refuses a
  case (any error it raises is recorded as the reason);
- ``sdpa-fa2`` / ``sdpa-cudnn`` / ``sdpa-eff``: SDPA forced onto one backend with ``is_causal=True`` where
  the mask is causal; ``sdpa-eff+mask`` / ``sdpa-cudnn+mask`` with the dense bool mask otherwise (what
  Transformers' "sdpa" hands SDPA for such masks, K/V repeated per query head as Transformers does);
- ``eager``: ``softmax(q k^T) v`` with the dense mask, as Transformers' "eager", at small sizes only.

A peer that cannot run a case is returned with ``skipped`` set to the reason instead of a function.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.metadata
import importlib.util
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.measure import CheckFailed
from omni_hf import OmniBlockMask, omni_attention

EAGER_MAX_SCORES = 1 << 27  # B * Hq * S * S score elements above which eager is not run

Fn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclasses.dataclass
class Peer:
    """One implementation for one case: ``fn`` or, when it cannot run, ``skipped`` (the reason)."""

    name: str
    fn: Fn | None = None
    skipped: str | None = None
    mask_mib: float = 0.0  # memory held by this peer's mask structures
    environ: dict[str, str] = dataclasses.field(default_factory=dict)  # set while it runs, backward included
    errors_skip: bool = False  # an error it raises (not a failed check) means it cannot run the case: skipped

    def running(self) -> contextlib.AbstractContextManager:
        """The context to check and time this peer in: its `environ` set, then restored. Wrap the backward
        too: autograd runs it after ``fn`` has returned."""
        return environ(self.environ)


def tensor_mib(*tensors: torch.Tensor | None) -> float:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor)) / (1 << 20)


@contextlib.contextmanager
def environ(variables: dict[str, str]):
    """Set environment variables for the duration of a block, then restore them."""
    before = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def omni(mask: OmniBlockMask, scale: float, sm80: bool = False) -> Peer:
    """omni's op; with ``sm80``, run under ``OMNI_HF_DISABLE_SM90=1`` (the library reads it at every launch),
    so the sm_80 forward and backward run where its Hopper kernels would."""
    fields = [getattr(mask, f.name) for f in dataclasses.fields(mask)]
    return Peer(f"omni b{mask.block_q}" + (" sm80" if sm80 else ""),
                lambda q, k, v: omni_attention(q, k, v, mask, scale=scale), mask_mib=tensor_mib(*fields),
                environ={"OMNI_HF_DISABLE_SM90": "1"} if sm80 else {})


def flex(block_mask, scale: float, gqa: bool) -> Peer:
    from torch.nn.attention.flex_attention import flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)
    return Peer("flex", lambda q, k, v: compiled(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa),
                mask_mib=tensor_mib(*block_mask.as_tuple()))


CUTE_KERNEL_WORDS = ("flash", "cutlass", "cute")  # in the names of FA4's kernels (Triton's are "triton_...")
FLASH_PACKAGES = ("flash-attn-4", "fa4", "nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl", "quack-kernels",
                  "apache-tvm-ffi", "cuda-bindings")


@functools.lru_cache(maxsize=1)
def _flash_import_error() -> str | None:
    """Why ``flash_attn.cute`` does not import (None when it does); imported once per process (seconds)."""
    try:
        import flash_attn.cute  # noqa: F401
    except Exception as err:  # noqa: BLE001 - any import failure (a missing module, a library) is the reason
        return f"flash_attn.cute not importable ({error_text(err)})"
    return None


def flash_unavailable() -> str | None:
    """Why Flex's FLASH backend cannot be tried here, or None: it needs a CUDA device, a torch with the backend
    (2.10 on) and ``flash_attn.cute`` (flash-attn-4), which Inductor's generated code imports."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    if importlib.util.find_spec("torch._inductor.kernel.flex.flex_flash_attention") is None:
        return f"torch {torch.__version__} has no FLASH backend for flex_attention"
    return _flash_import_error()


def flash_environment() -> dict[str, str | None]:
    """The installed versions of the FLASH backend's packages (None: not installed), for a result's meta."""
    versions: dict[str, str | None] = {}
    for name in FLASH_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def error_text(err: BaseException, limit: int = 400) -> str:
    """The exception type and its message (lines joined), cut at ``limit`` characters: Inductor wraps the
    backend's own error in its first lines."""
    text = " | ".join(line.strip() for line in str(err).strip().splitlines() if line.strip())
    return f"{type(err).__name__}: {text[:limit]}"


def flex_flash(block_mask, scale: float, gqa: bool) -> Peer:
    """``torch.compile(flex_attention)`` with ``kernel_options={"BACKEND": "FLASH"}`` (FlashAttention-4's
    CuTe-DSL kernels, forward and backward), the same ``BlockMask`` as ``flex``; skipped with the reason where
    the backend cannot be tried, and any error of a call (a mask, head dim or shape it refuses, a compile
    failure) is recorded as the reason it was skipped. Its first call must run a CuTe-DSL kernel (by the
    profiler's kernel names), else it fails its check: no silent fallback is timed as FLASH."""
    why = flash_unavailable()
    if why is not None:
        return Peer("flex-flash", skipped=why)
    from torch.nn.attention.flex_attention import flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)
    options = {"BACKEND": "FLASH"}
    checked = []

    def fn(q, k, v):
        call = lambda: compiled(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa,  # noqa: E731
                                kernel_options=options)
        if checked:
            return call()
        out, kernels = _kernels_run_by(call)  # the first call (the forward check): did a CuTe-DSL kernel run?
        if kernels is not None and not any(word in name.lower() for name in kernels for word in CUTE_KERNEL_WORDS):
            raise CheckFailed(f"BACKEND='FLASH' ran no CuTe-DSL kernel; CUDA kernels: {kernels[:4]}")
        checked.append(True)
        return out

    return Peer("flex-flash", fn, mask_mib=tensor_mib(*block_mask.as_tuple()), errors_skip=True)


def _kernels_run_by(call: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, list[str] | None]:
    """``call()`` and the names of the CUDA kernels it ran (None where the profiler could not say)."""
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            out = call()
            torch.cuda.synchronize()
    except RuntimeError as err:
        if "profiler" not in str(err).lower() and "cupti" not in str(err).lower():
            raise
        return call(), None
    return out, [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.name]


def _repeat_kv(k: torch.Tensor, v: torch.Tensor, heads_q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V with each head repeated for its query heads (Transformers' ``repeat_kv``)."""
    groups = heads_q // k.shape[1]
    return (k, v) if groups == 1 else (k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1))


def sdpa(backend_name: str, scale: float, dense: torch.Tensor | None) -> Peer:
    """SDPA on one backend: ``is_causal`` when ``dense`` is None, else the dense bool mask (K/V repeated)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"fa2": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
               "eff": SDPBackend.EFFICIENT_ATTENTION}[backend_name]
    if dense is None:
        def fn(q, k, v):
            if backend_name == "eff":  # the memory-efficient kernel has no native GQA
                k, v = _repeat_kv(k, v, q.shape[1])
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                                      enable_gqa=k.shape[1] != q.shape[1])
        return Peer(f"sdpa-{backend_name}", fn)
    mask = dense[None, None]

    def fn_masked(q, k, v):
        k, v = _repeat_kv(k, v, q.shape[1])
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    return Peer(f"sdpa-{backend_name}+mask", fn_masked, mask_mib=tensor_mib(dense))


def eager(scale: float, dense: torch.Tensor) -> Peer:
    """Transformers' eager attention: scores in the input dtype, softmax in float32."""
    def fn(q, k, v):
        k, v = _repeat_kv(k, v, q.shape[1])
        scores = (q @ k.transpose(-1, -2)) * scale
        scores = scores.masked_fill(~dense, float("-inf"))
        return torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v
    return Peer("eager", fn, mask_mib=tensor_mib(dense))


def for_case(omni_masks: list[OmniBlockMask], flex_mask, dense: torch.Tensor | None, *, is_causal: bool,
             heads_q: int, heads_kv: int, scale: float, why_missing: dict[str, str] | None = None,
             omni_sm80: bool = False) -> list[Peer]:
    """Every peer of one case, in report order, but ``flex-flash`` last: an experimental backend that could
    leave the GPU in an error state runs after the others have been measured.

    ``flex_mask`` (a Flex ``BlockMask``) or ``dense`` may be None when they could not be built, with the
    reason in ``why_missing["flex"]`` / ``why_missing["dense"]``; ``omni_sm80`` adds omni on its sm_80
    kernels for the masks of 128-blocks (the ones the Hopper forward takes).
    """
    why_missing = why_missing or {}
    peers = [omni(mask, scale) for mask in omni_masks]
    if omni_sm80:
        peers += [omni(mask, scale, sm80=True) for mask in omni_masks if mask.block_q == mask.block_kv == 128]
    peers.append(flex(flex_mask, scale, heads_q != heads_kv) if flex_mask is not None
                 else Peer("flex", skipped=why_missing.get("flex")))
    if is_causal:
        peers += [sdpa(name, scale, None) for name in ("fa2", "cudnn", "eff")]
    for name in ("eff", "cudnn") if not is_causal else ():
        peers.append(sdpa(name, scale, dense) if dense is not None
                     else Peer(f"sdpa-{name}+mask", skipped=why_missing.get("dense")))
    seq_len = omni_masks[0].q_len
    if heads_q * seq_len * seq_len > EAGER_MAX_SCORES:
        peers.append(Peer("eager", skipped=f"small sizes only (B*Hq*S*S > 2^{EAGER_MAX_SCORES.bit_length() - 1})"))
    elif dense is None:
        peers.append(Peer("eager", skipped=why_missing.get("dense")))
    else:
        peers.append(eager(scale, dense))
    peers.append(flex_flash(flex_mask, scale, heads_q != heads_kv) if flex_mask is not None
                 else Peer("flex-flash", skipped=why_missing.get("flex")))
    return peers
