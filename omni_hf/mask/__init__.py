"""Typed block masks: `OmniBlockMask` (mirroring the C ``OmniMask``), its builders by source and the token rule.

Modules: `block_mask` (the class, its named parts and builders), `types` (block types, mask kinds), `lists` (block
tables and lists), `dense` (dense masks, mask functions), `key_padding`, `token_blocks` (the token rule per block),
`token_rule` (per element), `token_ranges` (per position, as ranges), `spans` (spans to token ids), `flex`
(FlexAttention interop), `validation`.
"""

from .block_mask import BlockLists, OmniBlockMask, TokenRule
from .spans import token_ids_from_spans
from .token_ranges import RANGE_INEXACT, token_ranges
from .token_rule import MaskMod, token_mask_mod
from .types import BLOCK_SIZES, BlockType, MaskKind

__all__ = ["BLOCK_SIZES", "RANGE_INEXACT", "BlockLists", "BlockType", "MaskKind", "MaskMod", "OmniBlockMask",
           "TokenRule", "token_ids_from_spans", "token_mask_mod", "token_ranges"]
