"""omni_hf: typed block-sparse attention for interleaved text / image sequences."""
from .data import OmniCollator, VisionInputs
from .integrations import register
from .mask import BlockType, MaskKind, OmniBlockMask, token_ids_from_spans
from .ops import omni_attention

__all__ = ["BlockType", "MaskKind", "OmniBlockMask", "OmniCollator", "VisionInputs", "omni_attention", "register",
           "token_ids_from_spans"]

register()
