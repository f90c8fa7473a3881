"""Data: `OmniCollator` (samples to a padded or packed batch with the token rule's ids) and the vision families it
reads processed samples by (`VisionInputs`; `images` finds a sample's images, `conversations` runs raw ones through
a processor)."""

from .collator import OmniCollator
from .vision_inputs import FAMILIES, PROCESSORS, VisionInputs

__all__ = ["FAMILIES", "PROCESSORS", "OmniCollator", "VisionInputs"]
