"""Models "omni" cannot serve, refused when they are built with ``attn_implementation="omni"``.

Transformers validates a requested attention implementation when a model is built (and in
``set_attn_implementation``) through ``PreTrainedModel.get_correct_attn_implementation``; `refuse_unservable_models`
wraps it so that choosing "omni" for a model whose attention layers hand the attention function something omni does
not take raises there, naming the feature, instead of at the first forward. The features are read from the model's
own modeling code: whether its layers call the attention function at all, and the keyword arguments they pass it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
import inspect
import re
import sys

from transformers import PreTrainedModel

__all__ = ["OWN_ATTENTION", "UNSUPPORTED_FEATURES", "refuse_unservable_models", "unsupported_feature",
           "when_omni_is_chosen"]

# Keyword arguments of a model's attention-function calls that omni attention cannot honour.
UNSUPPORTED_FEATURES = {
    "s_aux": "attention sinks (`s_aux`, as in gpt-oss)",
    "position_bias": "an additive position bias (`position_bias`, as in T5)",
}
# A call of the attention function, its arguments spanning lines and holding calls nested two deep.
_ATTENTION_CALL = re.compile(r"attention_interface\(((?:[^()]|\((?:[^()]|\([^()]*\))*\))*)\)")


def when_omni_is_chosen(name: str, action: Callable[[type], None]) -> None:
    """Make Transformers call ``action(model_class)`` whenever it settles on "omni" for a model (built, or switched
    by ``set_attn_implementation``); ``name`` makes it idempotent."""
    original = PreTrainedModel.get_correct_attn_implementation
    actions = getattr(original, "omni_actions", ())
    if name in actions:
        return

    @functools.wraps(original)
    def get_correct_attn_implementation(self, requested_attention, is_init_check=False):
        chosen = original(self, requested_attention, is_init_check)
        if chosen == "omni":
            action(type(self))
        return chosen

    get_correct_attn_implementation.omni_actions = (*actions, name)
    PreTrainedModel.get_correct_attn_implementation = get_correct_attn_implementation


def refuse_unservable_models() -> None:
    """Make Transformers refuse "omni" for models `unsupported_feature` names a feature of (idempotent)."""
    when_omni_is_chosen("refuse unservable models", _refuse)


def _refuse(model_class: type) -> None:
    if (feature := unsupported_feature(model_class)) is not None:
        raise ValueError(f'attn_implementation="omni": {model_class.__name__} uses {feature}, which omni attention '
                         'does not support; use attn_implementation="eager" (or another that the model supports)')


OWN_ATTENTION = "attention layers of its own (they never call Transformers' attention function)"


def unsupported_feature(model_class: type) -> str | None:
    """What keeps omni from serving ``model_class``, or None: attention layers that do not call Transformers'
    attention function (`OWN_ATTENTION`, by Transformers' own reading of the model's code), or what they pass it that
    omni cannot honour (a description from `UNSUPPORTED_FEATURES`)."""
    uses_the_interface = getattr(model_class, "_can_set_attn_implementation", lambda: True)()
    return _module_feature(model_class.__module__) if uses_the_interface else OWN_ATTENTION


@functools.lru_cache(maxsize=None)
def _module_feature(module_name: str) -> str | None:
    module = sys.modules.get(module_name)
    try:
        source = inspect.getsource(module) if module is not None else ""
    except (OSError, TypeError):  # no source to read (a compiled or dynamically made module)
        return None
    for call in _ATTENTION_CALL.finditer(source):
        for keyword, feature in UNSUPPORTED_FEATURES.items():
            if re.search(rf"\b{keyword}\s*=", call.group(1)):
                return feature
    return None
