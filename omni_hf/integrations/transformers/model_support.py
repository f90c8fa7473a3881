"""What a model built with ``attn_implementation="omni"`` gets: omni, its own attention, or a refusal.

`omni_choice` decides, for the model (or sub-model: a vision or audio tower is built as a model of its own) that
Transformers settled on "omni" for:

- a tower (a model built as part of another) that keeps its own attention (`own_attention`: its class runs eager
  only, as Gemma 4's audio tower; or its layers pick their attention classes from a table of their own, as SAM's
  vision layers in DeepSeek-VL hybrid) runs that attention, with the mask it expects (what eager, or sdpa where it
  has it, gets), and a warning names it; a whole model that keeps its own attention is refused;
- a model whose attention layers pass the attention function something omni cannot honour (`unsupported_feature`:
  a keyword of `UNSUPPORTED_FEATURES`, none today, or layers that never call the function at all) is refused;
- a model whose layers have a head dim the op refuses on every backend (`unsupported_head_dims`: not a multiple of
  8, or above `omni_hf.ops.attention.MAX_HEAD_DIM`) is refused, naming the layer type and its head dim;
- every other model gets "omni".

The features are read from the model's own class and modeling code, and the head dims from its config, so nothing
here runs a forward. `patches` makes Transformers ask `omni_choice` when it validates the implementation.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys

from transformers.utils import logging

from ...ops.attention import MAX_HEAD_DIM

__all__ = ["OWN_ATTENTION", "UNSUPPORTED_FEATURES", "omni_choice", "own_attention", "unsupported_feature",
           "unsupported_head_dims"]

_logger = logging.get_logger(__name__)

# Keyword arguments of a model's attention-function calls that omni attention cannot honour, with their description:
# none today (T5's additive `position_bias` is `omni_attention`'s `bias`; gpt-oss's `s_aux` its `sinks`).
UNSUPPORTED_FEATURES: dict[str, str] = {}
OWN_ATTENTION = "attention layers of its own (they never call Transformers' attention function)"
# A call of the attention function, its arguments spanning lines and holding calls nested two deep.
_ATTENTION_CALL = re.compile(r"attention_interface\(((?:[^()]|\((?:[^()]|\([^()]*\))*\))*)\)")
# A table of attention classes keyed by implementation name, as a module defines it: `NAME_ATTENTION_CLASSES = {`.
_ATTENTION_TABLE = re.compile(r"^(\w+_ATTENTION_CLASSES)\s*=\s*\{", re.MULTILINE)


def omni_choice(model_class: type, config, tower: bool) -> str:
    """The implementation a model of ``model_class`` with ``config`` runs when "omni" is asked for: "omni", or, for a
    ``tower`` (a model built as part of another) that keeps its own attention (`own_attention`), that attention;
    raises ValueError for what omni cannot serve, a whole model that keeps its own attention included."""
    if (own := own_attention(model_class)) is not None:
        if not tower:
            raise ValueError(f'attn_implementation="omni": {model_class.__name__} keeps attention of its own (it runs '
                             f'eager only, or picks its attention classes from a table of its own); use '
                             f'attn_implementation="{own}"')
        _logger.warning_once(f'attn_implementation="omni": {model_class.__name__} keeps attention of its own; it runs '
                            f'attn_implementation="{own}" (with the mask that one gets), the rest of the model omni')
        return own
    if (feature := unsupported_feature(model_class)) is not None:
        raise ValueError(f'attn_implementation="omni": {model_class.__name__} uses {feature}, which omni attention '
                         'does not support; use attn_implementation="eager" (or another that the model supports)')
    if refused := unsupported_head_dims(config):
        layers = ", ".join(f"{layer_type} layers at head dim {dim}" for layer_type, dim in refused.items())
        raise ValueError(f'attn_implementation="omni": {model_class.__name__} has {layers}; omni attention runs '
                         f'head dims that are multiples of 8 up to {MAX_HEAD_DIM}. Use attn_implementation="sdpa" '
                         f'(or "eager"), or a config whose head_dim is one of those')
    return "omni"


def own_attention(model_class: type) -> str | None:
    """The implementation a model that keeps its own attention runs instead of omni, or None when its layers take
    omni's: "eager" for a class that supports no other (``_supports_attention_backend``, ``_supports_sdpa``,
    ``_supports_flash_attn`` and ``_supports_flex_attn`` all False, as Gemma 4's audio tower); for a class whose
    module picks attention classes from a table (``*_ATTENTION_CLASSES``, as SAM), "sdpa" where the table and the
    class have it, else "eager"."""
    flags = ("_supports_attention_backend", "_supports_sdpa", "_supports_flash_attn", "_supports_flex_attn")
    if not any(getattr(model_class, flag, False) for flag in flags):
        return "eager"
    table = _attention_table_keys(model_class.__module__)
    if table is None or "omni" in table:
        return None
    return "sdpa" if "sdpa" in table and getattr(model_class, "_supports_sdpa", False) else "eager"


def unsupported_feature(model_class: type) -> str | None:
    """What keeps omni from serving ``model_class``, or None: attention layers that do not call Transformers'
    attention function (`OWN_ATTENTION`, by Transformers' own reading of the model's code), or what they pass it that
    omni cannot honour (a description from `UNSUPPORTED_FEATURES`)."""
    uses_the_interface = getattr(model_class, "_can_set_attn_implementation", lambda: True)()
    return _module_feature(model_class.__module__) if uses_the_interface else OWN_ATTENTION


def unsupported_head_dims(config) -> dict[str, int]:
    """The head dims of ``config``'s attention layers that the op refuses, by layer type (the first refused dim of
    each): not a multiple of 8, or above `MAX_HEAD_DIM`. Read from ``head_dim`` (per layer where the config is
    heterogeneous, as Gemma 4's global layers) or ``hidden_size / num_attention_heads``; a config that states
    neither is not checked (its layers' calls are, at the first forward)."""
    refused: dict[str, int] = {}
    for layer_type, dim in _head_dims(config):
        if (dim % 8 or dim > MAX_HEAD_DIM) and layer_type not in refused:
            refused[layer_type] = dim
    return refused


def _head_dims(config) -> list[tuple[str, int]]:
    """(layer type, head dim) of each attention layer of ``config`` it can tell, else []."""
    layers = getattr(config, "num_hidden_layers", None)
    per_layer = getattr(config, "per_layer_config", None) if isinstance(layers, int) else None
    types = getattr(config, "layer_types", None) or ["attention"] * (layers or 1)
    if per_layer is not None:
        try:
            dims = [getattr(per_layer[i], "head_dim", None) for i in range(layers)]
        except (AttributeError, IndexError, KeyError, TypeError):
            dims = []
        if dims and all(isinstance(dim, int) for dim in dims):
            return list(zip(types, dims))
    dim = _global_head_dim(config)
    if dim is None:
        return []
    full_dim = getattr(config, "global_head_dim", None)  # Gemma 4 before per-layer configs: its full-attention layers
    full_dim = full_dim if isinstance(full_dim, int) else dim
    return [(layer_type, full_dim if layer_type == "full_attention" else dim) for layer_type in dict.fromkeys(types)]


def _global_head_dim(config) -> int | None:
    try:
        dim = getattr(config, "head_dim", None)
    except AttributeError:  # a heterogeneous config refuses the global read
        return None
    if isinstance(dim, int):
        return dim
    hidden, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 and hidden % heads == 0:
        return hidden // heads
    return None


@functools.lru_cache(maxsize=None)
def _module_source(module_name: str) -> str:
    module = sys.modules.get(module_name)
    try:
        return inspect.getsource(module) if module is not None else ""
    except (OSError, TypeError):  # no source to read (a compiled or dynamically made module)
        return ""


@functools.lru_cache(maxsize=None)
def _module_feature(module_name: str) -> str | None:
    for call in _ATTENTION_CALL.finditer(_module_source(module_name)):
        for keyword, feature in UNSUPPORTED_FEATURES.items():
            if re.search(rf"\b{keyword}\s*=", call.group(1)):
                return feature
    return None


def _attention_table_keys(module_name: str) -> set[str] | None:
    """The keys of the first attention-class table the module defines, or None when it defines none."""
    match = _ATTENTION_TABLE.search(_module_source(module_name))
    table = getattr(sys.modules.get(module_name), match.group(1), None) if match else None
    return set(table) if isinstance(table, dict) else None
