"""The two changes "omni" makes to Transformers' classes, installed by `install` and undone by `remove`.

1. ``PreTrainedModel.get_correct_attn_implementation`` (Transformers' validation of the implementation a model is
   built with, or switched to by ``set_attn_implementation``) is wrapped: where Transformers settles on "omni", the
   wrapper returns `model_support.omni_choice` instead (a tower's own attention, or a refusal at build) and lets packed
   vision towers of the model's modeling module make one call per layer (`packed_towers.pack_vision_towers`). For
   every other implementation it returns Transformers' answer unchanged.
2. The ``forward`` of those packed attention classes is wrapped (`packed_towers`); outside a model whose config names
   "omni" the wrapper calls the original forward unchanged.

Nothing else in Transformers is touched; models that never choose "omni" run exactly as without omni_hf.
"""

from __future__ import annotations

import functools
import inspect

from transformers import PreTrainedModel

from .model_support import omni_choice
from .packed_towers import pack_vision_towers, unpack_vision_towers

__all__ = ["install", "installed", "remove"]

_ORIGINAL = "omni_original"  # the attribute of the wrapper that holds Transformers' own method


def install() -> None:
    """Wrap ``PreTrainedModel.get_correct_attn_implementation`` (idempotent)."""
    if installed():
        return
    original = PreTrainedModel.get_correct_attn_implementation

    @functools.wraps(original)
    def get_correct_attn_implementation(self, requested_attention, is_init_check=False):
        chosen = original(self, requested_attention, is_init_check)
        if chosen != "omni":
            return chosen
        chosen = omni_choice(type(self), self.config, tower=_built_inside_another_model(self))
        if chosen == "omni":
            pack_vision_towers(type(self).__module__)
        return chosen

    setattr(get_correct_attn_implementation, _ORIGINAL, original)
    PreTrainedModel.get_correct_attn_implementation = get_correct_attn_implementation


def remove() -> None:
    """Restore Transformers' own method and the packed towers' own forwards (idempotent)."""
    if installed():
        PreTrainedModel.get_correct_attn_implementation = getattr(PreTrainedModel.get_correct_attn_implementation,
                                                                  _ORIGINAL)
    unpack_vision_towers()


def installed() -> bool:
    """Whether `install` is in effect."""
    return hasattr(PreTrainedModel.get_correct_attn_implementation, _ORIGINAL)


def _built_inside_another_model(model: PreTrainedModel) -> bool:
    """Whether ``model`` is built (or switched) as part of another model: a vision or audio tower, a sub-model."""
    frame = inspect.currentframe()
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, PreTrainedModel) and owner is not model:
            return True
        frame = frame.f_back
    return False
