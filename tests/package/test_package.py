"""The package's face: its public names and its version."""

from importlib import metadata

import omni_hf


def test_version_is_the_installed_distributions():
    assert omni_hf.__version__ == metadata.version("omni_hf")


def test_public_names_are_exported_and_importable():
    assert set(omni_hf.__all__) == {"BlockType", "MaskKind", "OmniBlockMask", "OmniCollator", "VisionInputs",
                                    "__version__", "omni_attention", "register", "token_ids_from_spans"}
    assert all(hasattr(omni_hf, name) for name in omni_hf.__all__)
