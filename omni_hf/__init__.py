"""omni_hf: typed block-sparse attention for interleaved text / image sequences."""
from .collator import OmniCollator
from .integrations import register
from .mask import BlockType, MaskKind, OmniBlockMask, token_ids_from_spans
from .ops import omni_attention
from .vision_inputs import VisionInputs

__all__ = ["BlockType", "MaskKind", "OmniBlockMask", "OmniCollator", "VisionInputs", "omni_attention", "register",
           "token_ids_from_spans"]

register()
