"""``attn_implementation="omni"`` for Hugging Face Transformers.

`register` adds "omni" to Transformers' `AttentionInterface` (`attention.omni_attention_forward`) and
`AttentionMaskInterface` (`spec.omni_mask`, whose spec `recognition` reads). See README.md beside this file.
"""

from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from .attention import omni_attention_forward
from .spec import OmniMaskSpec, omni_mask

__all__ = ["OmniMaskSpec", "omni_attention_forward", "omni_mask", "register"]


def register() -> None:
    """Register "omni" in Transformers' attention and mask interfaces (idempotent)."""
    AttentionInterface.register("omni", omni_attention_forward)
    AttentionMaskInterface.register("omni", omni_mask)
