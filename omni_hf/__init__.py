"""omni_hf: typed block-sparse attention for interleaved text / image sequences."""
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
