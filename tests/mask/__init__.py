"""OmniBlockMask: builders, token ranges, the block lists against dense definitions."""
