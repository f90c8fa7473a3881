"""The three changes "omni" makes to Transformers' classes, installed by `install` and undone by `remove`.

1. ``PreTrainedModel.get_correct_attn_implementation`` (Transformers' validation of the implementation a model is
   built with, or switched to by ``set_attn_implementation``) is wrapped: where Transformers settles on "omni", the
   wrapper returns `model_support.omni_choice` instead (a tower's own attention, or a refusal at build) and lets packed
   vision towers of the model's modeling module make one call per layer (`packed_towers.pack_vision_towers`). For
   every other implementation it returns Transformers' answer unchanged.
2. ``PreTrainedModel.post_init`` (which every model calls once its modules are built) is wrapped: for a model whose
   config names "omni" it asks `model_support.omni_choice` again, now that the modules it reads exist (a tower whose
   attention modules never call the attention function then runs eager; a whole model is refused). For every other
   model it only runs Transformers' own.
3. The ``forward`` of those packed attention classes is wrapped (`packed_towers`); outside a model whose config names
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

_ORIGINAL = "omni_original"  # the attribute of a wrapper that holds Transformers' own method
_WRAPPED = ("get_correct_attn_implementation", "post_init")


def install() -> None:
    """Wrap ``PreTrainedModel.get_correct_attn_implementation`` and ``PreTrainedModel.post_init`` (idempotent)."""
    if installed():
        return
    original_choice, original_post_init = (getattr(PreTrainedModel, name) for name in _WRAPPED)

    @functools.wraps(original_choice)
    def get_correct_attn_implementation(self, requested_attention, is_init_check=False):
        chosen = original_choice(self, requested_attention, is_init_check)
        if chosen != "omni":
            return chosen
        chosen = omni_choice(self, _outer_model(self))
        if chosen == "omni":
            pack_vision_towers(type(self).__module__)
        return chosen

    @functools.wraps(original_post_init)
    def post_init(self):
        original_post_init(self)
        if self.config._attn_implementation == "omni":
            self.config._attn_implementation_internal = omni_choice(self, _outer_model(self))

    for name, wrapper in zip(_WRAPPED, (get_correct_attn_implementation, post_init)):
        setattr(wrapper, _ORIGINAL, getattr(PreTrainedModel, name))
        setattr(PreTrainedModel, name, wrapper)


def remove() -> None:
    """Restore Transformers' own methods and the packed towers' own forwards (idempotent)."""
    if installed():
        for name in _WRAPPED:
            setattr(PreTrainedModel, name, getattr(getattr(PreTrainedModel, name), _ORIGINAL))
    unpack_vision_towers()


def installed() -> bool:
    """Whether `install` is in effect."""
    return hasattr(PreTrainedModel.get_correct_attn_implementation, _ORIGINAL)


def _outer_model(model: PreTrainedModel) -> PreTrainedModel | None:
    """The outermost model that ``model`` is built (or switched) inside of as a tower: a model of another config (a
    vision or audio tower, a sub-model of a composite config); None for a whole model (``XForCausalLM``'s inner
    ``XModel`` shares its config: it is part of the whole model)."""
    outer = None
    frame = inspect.currentframe()
    while frame is not None:
        owner = frame.f_locals.get("self")
        if (isinstance(owner, PreTrainedModel) and owner is not model
                and getattr(owner, "config", model.config) is not model.config):
            outer = owner
        frame = frame.f_back
    return outer
