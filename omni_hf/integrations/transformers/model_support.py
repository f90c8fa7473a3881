"""What a model built with ``attn_implementation="omni"`` gets: omni, its own attention, or a refusal.

`omni_choice` decides, for the model (or sub-model: a vision or audio tower is built as a model of its own) that
Transformers settled on "omni" for:

- a model that keeps attention of its own (`own_attention`: its class runs eager only, its layers pick their
  attention classes from a table of their own, or its attention modules never call Transformers' attention
  function): a tower (a model of another config built inside another model: Gemma 4's audio tower, SAM's vision
  layers in DeepSeek-VL hybrid, GOT-OCR2's vision encoder) runs that attention, with the mask it expects (its config
  names that implementation, so the mask creators give it what eager, or sdpa, gets and no omni mask spec reaches
  it), and a warning names it; a whole model is refused;
- a model whose attention layers pass the attention function something omni cannot honour (`unsupported_feature`:
  a keyword of `UNSUPPORTED_FEATURES`, none today) is refused;
- a model whose layers have a head dim the op refuses on every backend (`unsupported_head_dims`: not a multiple of
  8, or above `omni_hf.ops.attention.MAX_HEAD_DIM`) is refused, naming the layer type and its head dim;
- every other model gets "omni".

A refusal names what to pass instead: for a whole model an implementation, for a tower the ``attn_implementation``
dict that gives its sub-config that implementation and every other sub-config omni (`instead_of_omni`).

The features are read from the model's class, modeling code and modules, and the head dims from its config, so
nothing here runs a forward. `patches` makes Transformers ask `omni_choice` when it validates the implementation and
again once the model's modules are built.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
import sys

import torch
from transformers import PreTrainedModel
from transformers.utils import logging

from ...ops.attention import MAX_HEAD_DIM

__all__ = ["UNSUPPORTED_FEATURES", "attends_on_its_own", "images_causal_in_layer", "instead_of_omni", "omni_choice",
           "own_attention", "unsupported_feature", "unsupported_head_dims"]

_logger = logging.get_logger(__name__)

# Keyword arguments of a model's attention-function calls that omni attention cannot honour, with their description:
# none today (T5's additive `position_bias` is `omni_attention`'s `bias`; gpt-oss's `s_aux` its `sinks`).
UNSUPPORTED_FEATURES: dict[str, str] = {}
# A call of the attention function, its arguments spanning lines and holding calls nested two deep.
_ATTENTION_CALL = re.compile(r"attention_interface\(((?:[^()]|\((?:[^()]|\([^()]*\))*\))*)\)")
# A table of attention classes keyed by implementation name, as a module defines it: `NAME_ATTENTION_CLASSES = {`.
_ATTENTION_TABLE = re.compile(r"^(\w+_ATTENTION_CLASSES)\s*=\s*\{", re.MULTILINE)
# What the code of an attention class that calls Transformers' attention function holds.
_CALLS_THE_FUNCTION = ("ALL_ATTENTION_FUNCTIONS", "attention_interface")


def omni_choice(model: PreTrainedModel, outer: PreTrainedModel | None) -> str:
    """The implementation ``model`` runs when "omni" is asked for: "omni", or, for a tower (``outer``: the outermost
    model it is built inside, None for a whole model) that keeps its own attention (`own_attention`), that attention;
    raises ValueError for what omni cannot serve, a whole model that keeps its own attention included, naming what to
    pass instead."""
    model_class = type(model)
    if (own := own_attention(model, tower=outer is not None)) is not None:
        if outer is None:
            raise ValueError(f'attn_implementation="omni": {model_class.__name__} keeps attention of its own (it runs '
                             f'eager only, picks its attention classes from a table of its own, or its attention '
                             f'layers never call the attention function); use attn_implementation="{own}"')
        _logger.warning_once(f'attn_implementation="omni": {model_class.__name__} keeps attention of its own; it runs '
                            f'attn_implementation="{own}" (with the mask that one gets), the rest of the model omni')
        return own
    if (feature := unsupported_feature(model_class)) is not None:
        raise ValueError(f'attn_implementation="omni": {model_class.__name__} uses {feature}, which omni attention '
                         f'does not support; {instead_of_omni(model, outer)}')
    if refused := unsupported_head_dims(model.config):
        layers = ", ".join(f"{layer_type} layers at head dim {dim}" for layer_type, dim in refused.items())
        raise ValueError(f'attn_implementation="omni": {model_class.__name__} has {layers}; omni attention runs '
                         f'head dims that are multiples of 8 up to {MAX_HEAD_DIM}; {instead_of_omni(model, outer)}')
    return "omni"


def instead_of_omni(model: PreTrainedModel, outer: PreTrainedModel | None) -> str:
    """What to pass instead of "omni" for ``model``, as a sentence: its best other implementation ("sdpa" where its
    class has it, else "eager"); for a tower of ``outer`` whose config is one of outer's sub-configs, the
    ``attn_implementation`` dict that gives that sub-config this implementation and every other one omni."""
    other = "sdpa" if getattr(type(model), "_supports_sdpa", False) else "eager"
    path = None if outer is None else _sub_config_path(outer.config, model.config)
    if path is None:
        return f'use attn_implementation="{other}" (or another that the model supports)'
    chosen = json.dumps(_per_sub_config(outer.config, path, other))
    return (f'its sub-config {".".join(path)} cannot run omni: build {type(outer).__name__} with '
            f'attn_implementation={chosen}')


def own_attention(model: PreTrainedModel, tower: bool) -> str | None:
    """The implementation ``model`` runs instead of omni because it keeps attention of its own, or None when its
    layers take omni's:

    - "eager" for a class that supports no other (``_supports_attention_backend``, ``_supports_sdpa``,
      ``_supports_flash_attn`` and ``_supports_flex_attn`` all False: Gemma 4's audio tower in Transformers 5.24);
    - for a class whose module picks attention classes from a table (``*_ATTENTION_CLASSES``: SAM, Falcon), "sdpa"
      where the table and the class have it, else "eager";
    - "eager" where its attention modules never call Transformers' attention function (`attends_on_its_own`, once
      they are built: Gemma 4's audio tower in Transformers 5.9, whose class claims every implementation; GOT-OCR2's
      vision encoder), and, for a tower, already before, where Transformers reads so from its module's code
      (``_can_set_attn_implementation``). A whole model is asked with its towers: it keeps its own attention only
      where no attention module of it calls the function (T5 before 5.13), not where a tower does (GOT-OCR2)."""
    model_class = type(model)
    flags = ("_supports_attention_backend", "_supports_sdpa", "_supports_flash_attn", "_supports_flex_attn")
    if not any(getattr(model_class, flag, False) for flag in flags):
        return "eager"
    table = _attention_table_keys(model_class.__module__)
    if table is not None and "omni" not in table:
        return "sdpa" if "sdpa" in table and getattr(model_class, "_supports_sdpa", False) else "eager"
    if tower and not getattr(model_class, "_can_set_attn_implementation", lambda: True)():
        return "eager"
    return "eager" if attends_on_its_own(model, with_towers=not tower) else None


def attends_on_its_own(model: PreTrainedModel, with_towers: bool) -> bool:
    """Whether ``model``'s attention modules (those whose class name holds "Attention"; its towers', models of another
    config, only ``with_towers``) never call Transformers' attention function: none of their classes' code reads
    ``ALL_ATTENTION_FUNCTIONS`` or calls an ``attention_interface``. False for a model with no attention modules, or
    none built yet (`patches` asks again once they are)."""
    classes = set()
    stack = list(model.children())
    while stack:
        module = stack.pop()
        if not with_towers and isinstance(module, PreTrainedModel) and module.config is not model.config:
            continue  # a tower: asked on its own
        if "Attention" in type(module).__name__:
            classes.add(type(module))
        stack.extend(module.children())
    return bool(classes) and not any(map(_calls_the_function, classes))


def images_causal_in_layer(module: torch.nn.Module, sliding_window: int | None) -> bool:
    """Whether the model of attention ``module`` keeps image tokens causal in the layers of this call's type while it
    attends them both ways in its others, so that the collator's image groups (``omni_group_ids``) do not apply here.

    True for the global layers (called with no ``sliding_window``) of a model whose text config asks for image blocks
    by ``use_bidirectional_attention="vision"`` (Gemma 4) where the modeling module of the module's class composes
    its masks per layer type with ``create_masks_for_vision_model`` (Transformers 5.24: image blocks in the sliding
    layers only); under Transformers 5.9 its global layers get the blocks too, as Gemma 3's every layer does. Read
    from the module's config and class and the call's window, so the layers sharing a window share the answer (and
    the ids mask `layer_mask` builds for them)."""
    if sliding_window is not None:
        return False
    if getattr(getattr(module, "config", None), "use_bidirectional_attention", None) != "vision":
        return False
    modules = (sys.modules.get(cls.__module__) for cls in type(module).__mro__)
    return any(hasattr(modeling, "create_masks_for_vision_model") for modeling in modules)


def unsupported_feature(model_class: type) -> str | None:
    """What ``model_class``'s attention layers pass Transformers' attention function that omni cannot honour (a
    description from `UNSUPPORTED_FEATURES`), or None."""
    return _module_feature(model_class.__module__)


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


@functools.lru_cache(maxsize=None)
def _calls_the_function(module_class: type) -> bool:
    """Whether the code of ``module_class`` (or of a class it derives from) calls Transformers' attention function;
    True where no code can be read (no refusal on a guess)."""
    for cls in module_class.__mro__:
        if cls is torch.nn.Module or cls is object:
            continue
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            return True
        if any(name in source for name in _CALLS_THE_FUNCTION):
            return True
    return False


def _sub_config_path(config, sub_config) -> list[str] | None:
    """The keys from ``config`` down its ``sub_configs`` to ``sub_config`` (by identity), or None where it is not one
    of them."""
    for key in getattr(config, "sub_configs", None) or {}:
        child = getattr(config, key, None)
        if child is sub_config:
            return [key]
        if child is not None and (rest := _sub_config_path(child, sub_config)) is not None:
            return [key, *rest]
    return None


def _per_sub_config(config, path: list[str], other: str) -> dict:
    """The ``attn_implementation`` dict for ``config`` that gives the sub-config at ``path`` ``other`` and every other
    (sub-)config "omni" (a nested dict per level of ``path``)."""
    chosen = {"": "omni"} | {key: "omni" for key in config.sub_configs if getattr(config, key, None) is not None}
    head, *rest = path
    chosen[head] = _per_sub_config(getattr(config, head), rest, other) if rest else other
    return chosen
