"""``attn_implementation="omni"`` for Hugging Face Transformers.

`register` adds "omni" to Transformers' `AttentionInterface` (`attention.omni_attention_forward`) and
`AttentionMaskInterface` (`spec.omni_mask`, whose spec `recognition` reads), makes Transformers refuse "omni"
when a model it cannot serve is built (`model_support`), and lets packed vision towers make one call per layer
(`packed_towers`). See README.md beside this file.
"""

from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from .attention import omni_attention_forward
from .model_support import refuse_unservable_models
from .packed_towers import PACKED, pack_vision_towers_on_build
from .spec import OmniMaskSpec, omni_mask

__all__ = ["OmniMaskSpec", "omni_attention_forward", "omni_mask", "register"]


def register() -> None:
    """Register "omni" in Transformers' attention and mask interfaces, its refusal of models it cannot serve, and
    packed vision towers (idempotent)."""
    AttentionInterface.register("omni", omni_attention_forward)
    AttentionInterface.register(PACKED, omni_attention_forward)
    AttentionMaskInterface.register("omni", omni_mask)
    refuse_unservable_models()
    pack_vision_towers_on_build()
