"""Packed vision towers under "omni": one attention call per layer, not one per image or window.

Vision towers that pack their images into one sequence (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V and others) hand the
images' boundaries, ``cu_seqlens``, only to attention implementations whose name contains "flash"; any other gets one
call per image or window (25,404 calls per 16k-token row of Qwen2.5-VL-3B), each paying a call's host cost.

When Transformers builds a model with "omni" (`patches`), `pack_vision_towers` wraps the forward of every such
attention class of the model's modeling module: under "omni" the module's own forward runs with its config naming
`PACKED` (registered to omni's attention function, and containing "flash"), so the module takes its packed branch
and omni gets one call with ``cu_seq_lens_q`` / ``cu_seq_lens_k``, which it attends as one bidirectional block per
image or window. Outside that forward the config names "omni", so saving, reloading and every other layer see only
"omni". A class whose code picks its branch some other way keeps its calls per image, which omni runs as well.
`unpack_vision_towers` restores every wrapped forward.
"""

from __future__ import annotations

import functools
import inspect
import sys

import torch

__all__ = ["PACKED", "pack_vision_towers", "packs_by_name", "unpack_vision_towers"]

PACKED = "omni_flash_packed"
_WRAPPED: list[type] = []  # the classes whose forward `pack_vision_towers` wrapped


def pack_vision_towers(module_name: str) -> None:
    """Wrap the forward of every attention class defined in the module ``module_name`` that `packs_by_name`
    (idempotent)."""
    module = sys.modules.get(module_name)
    for cls in list(vars(module).values()) if module is not None else ():
        if (isinstance(cls, type) and issubclass(cls, torch.nn.Module) and cls.__module__ == module_name
                and "forward" in vars(cls) and not getattr(cls.forward, "omni_packed", False) and packs_by_name(cls)):
            cls.forward = _packed(cls.forward)
            _WRAPPED.append(cls)


def unpack_vision_towers() -> None:
    """Restore the forward of every class `pack_vision_towers` wrapped."""
    while _WRAPPED:
        cls = _WRAPPED.pop()
        cls.forward = cls.forward.__wrapped__


def packs_by_name(cls: type) -> bool:
    """Whether ``cls.forward`` hands ``cu_seqlens`` to the attention function when its config's implementation is a
    flash one (read from its code: a branch on "flash" that passes ``cu_seq_lens_q=cu_seqlens``)."""
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):  # no source to read
        return False
    return "cu_seq_lens_q=cu_seqlens" in source and "flash" in source


def _packed(forward):
    @functools.wraps(forward)
    def packed(self, *args, **kwargs):
        config = self.config
        if config._attn_implementation != "omni":
            return forward(self, *args, **kwargs)
        config._attn_implementation = PACKED
        try:
            return forward(self, *args, **kwargs)
        finally:
            config._attn_implementation = "omni"

    packed.omni_packed = True
    return packed
