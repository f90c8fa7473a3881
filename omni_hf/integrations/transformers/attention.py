"""``attn_implementation="omni"``: the attention function Transformers' layers call.

One call goes one way: its inputs (the layer's `OmniMaskSpec` from `spec.omni_mask`, or the kwargs of the
collator) -> the call's block mask (`layer_mask`, which reads Transformers' mask functions through `recognition`)
-> the prepared call (`omni_hf.ops.attention.prepare_call`: checks and backend) -> the op
(`omni_hf.ops.attention.run_call`). The layers of one forward share their spec, and `_prepared_call` keeps the
block masks and prepared calls in its per-forward cache (`OmniMaskSpec.built`), so each is made once per forward.

Under the token rule (causal-family masks with padding, packing, image blocks) rows of padding tokens output zeros;
bidirectional masks never mask a query row (a cross-attention query is not one of the keys), and masks evaluated tile
by tile give those rows what the mask function gives. Transformers leaves rows of padding tokens arbitrary.
"""

from __future__ import annotations

import torch
from transformers.utils import logging

from ...ops.attention import PreparedCall, cast_for_autocast, prepare_call, run_call
from .layer_mask import layer_mask, shared_mask_source
from .model_support import UNSUPPORTED_FEATURES, images_causal_in_layer
from .spec import OmniMaskSpec

__all__ = ["omni_attention_forward"]

_logger = logging.get_logger(__name__)


def omni_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: OmniMaskSpec | torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    sliding_window: int | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Transformers' attention function for "omni".

    Args:
        query: ``[B, Hq, Sq, D]``; key, value: ``[B, Hkv, Skv, D]`` (GQA as is, no ``repeat_kv``).
        attention_mask: the layer's `OmniMaskSpec`, an `OmniBlockMask` (prepared for the layer's type), None (no
            mask), a bool ``[B|1, H|1, Sq, Skv]`` mask, or a float one (additive, as eager adds it: the op's bias over
            every key; Pixtral's tower under Transformers 5.9).
        scaling, softcap: as in `omni_attention`.
        sliding_window: the layer's window, applied to ``omni_doc_ids`` and to a missing mask.
        is_causal: for a missing mask (default ``module.is_causal``, else True).
        kwargs: ``s_aux``: the layer's sink logits ``[Hq]`` (gpt-oss), `omni_attention`'s ``sinks``;
            ``position_bias``: the layer's additive score bias (T5's relative position bias ``[1|B, Hq, Sq, Skv]``,
            Pix2Struct's and UDOP's), `omni_attention`'s ``bias``, differentiable;
            ``omni_block_mask``, ``omni_doc_ids``, ``omni_group_ids``, ``cu_seq_lens_k`` (see `layer_mask`);
            ``omni_context_parallel`` (`omni_hf.distributed.ContextParallel`: the call is this rank's shard of a
            row, attended over the whole row); ``output_attentions`` only warns.
    Returns:
        attn_output ``[B, Sq, Hq, D]`` and None for the weights.
    """
    if dropout > 0:
        raise ValueError("`omni` attention does not support attention dropout. Use the model in eval mode "
                         "(`model.eval()`) or set the attention dropout of its config to 0.")
    if not _SPECIAL_KWARGS.isdisjoint(kwargs):
        _check_kwargs(kwargs)
        if (context_parallel := kwargs.get("omni_context_parallel")) is not None:  # this rank's shard of the row
            if kwargs.get("s_aux") is not None:
                raise ValueError("omni_context_parallel: attention sinks (`s_aux`) are not supported under context "
                                 "parallelism yet; train this model without omni_context_parallel")
            if kwargs.get("position_bias") is not None:
                raise ValueError("omni_context_parallel: an additive position bias (`position_bias`, as in T5) is not "
                                 "supported under context parallelism yet; train this model without "
                                 "omni_context_parallel")
            out = context_parallel.attention(query, key, value, scale=scaling, softcap=softcap, window=sliding_window,
                                             images=not images_causal_in_layer(module, sliding_window))
            return out.transpose(1, 2).contiguous(), None
    query, key, value = cast_for_autocast(query, key, value)
    call, key_order = _prepared_call(module, query, key, value, attention_mask, scaling, softcap, sliding_window,
                                     is_causal, kwargs)
    bias = kwargs.get("position_bias")
    if isinstance(attention_mask, torch.Tensor) and attention_mask.is_floating_point():  # a model's additive mask
        bias = attention_mask if bias is None else bias + attention_mask
    if key_order is not None:
        key, value = key.index_select(2, key_order), value.index_select(2, key_order)
        if bias is not None and bias.shape[-1] != 1:  # the bias's keys follow the cache's slots, as the keys did
            bias = bias.index_select(-1, key_order)
    out, _ = run_call(call, query, key, value, kwargs.get("s_aux"), bias)
    return out.transpose(1, 2).contiguous(), None


# Keyword arguments that change what a call does; a call with none of them skips their checks.
_SPECIAL_KWARGS = frozenset((*UNSUPPORTED_FEATURES, "output_attentions", "omni_context_parallel", "omni_block_mask",
                             "omni_doc_ids", "omni_group_ids", "cu_seq_lens_k"))


def _check_kwargs(kwargs: dict) -> None:
    """Refuse the features omni cannot honour; warn that attention weights are not returned."""
    for name, feature in UNSUPPORTED_FEATURES.items():
        if kwargs.get(name) is not None:
            raise ValueError(f"`omni` attention does not support {feature}; use `eager` for this model.")
    if kwargs.get("output_attentions"):
        _logger.warning_once("`omni` attention does not return attention weights (`output_attentions=True`); "
                            "use `eager` to get them.")


def _prepared_call(module, query, key, value, mask, scaling, softcap, sliding_window, is_causal,
                   kwargs) -> tuple[PreparedCall, torch.Tensor | None]:
    """The call prepared for its block mask and the key order that mask assumes (`layer_mask`): the per-forward
    cache. Layers sharing a spec share their mask (per `shared_mask_source`, device and sizes) and their prepared call
    (per mask, dtype, shapes and scalars), so the mask is built, and the checks and backend choice run, once per
    forward."""
    source = shared_mask_source(mask, sliding_window, kwargs)
    if source is None:
        block_mask, key_order = layer_mask(module, query, key, mask, sliding_window, is_causal, kwargs)
        return prepare_call(query, key, value, block_mask, scaling, softcap), key_order
    built = mask.built
    call_key = (source, query.device, query.dtype, query.shape, key.shape, scaling, softcap)
    prepared = built.get(call_key)
    if prepared is None:
        mask_key = (source, query.device, query.shape[0], query.shape[2], key.shape[2])
        if mask_key not in built:
            built[mask_key] = layer_mask(module, query, key, mask, sliding_window, is_causal, kwargs)
        block_mask, key_order = built[mask_key]
        prepared = built[call_key] = prepare_call(query, key, value, block_mask, scaling, softcap), key_order
    return prepared
