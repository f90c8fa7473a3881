"""omni_hf: typed block-sparse attention for interleaved text / image sequences."""
from .collator import OmniCollator
from .integrations import register
from .mask import BlockType, OmniBlockMask, token_ids_from_spans
from .ops import omni_attention

__all__ = ["BlockType", "OmniBlockMask", "OmniCollator", "omni_attention", "register", "token_ids_from_spans"]

register()
