"""OmniCollator: packing, vision inputs from processors."""
