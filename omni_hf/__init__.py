"""omni_hf: typed block-sparse attention for interleaved text / image sequences.

Importing it registers ``attn_implementation="omni"`` with Transformers (`register`); what that changes in
Transformers, and how to opt out, is stated in `omni_hf.integrations.transformers`.
"""
from importlib import metadata

from .data import OmniCollator, VisionInputs
from .integrations import register
from .mask import BlockType, MaskKind, OmniBlockMask, token_ids_from_spans
from .ops import omni_attention

try:
    __version__ = metadata.version("omni_hf")
except metadata.PackageNotFoundError:  # a source tree that is not installed
    __version__ = "0+unknown"

__all__ = ["BlockType", "MaskKind", "OmniBlockMask", "OmniCollator", "VisionInputs", "__version__", "omni_attention",
           "register", "token_ids_from_spans"]

register()
