"""``attn_implementation="omni"`` for Hugging Face Transformers.

What ``import omni_hf`` changes in Transformers (it runs `register`), all of it here:

- registers "omni" in ``AttentionInterface`` (`attention.omni_attention_forward`) and ``AttentionMaskInterface``
  (`spec.omni_mask`), and the name `packed_towers.PACKED` in ``AttentionInterface`` (packed vision towers' calls);
- installs `patches`: ``PreTrainedModel.get_correct_attn_implementation`` and ``PreTrainedModel.post_init`` are
  wrapped so that a model built with (or switched to) "omni" is served, given its own attention, or refused at build
  (`model_support.omni_choice`, asked again once the model's modules exist), and packed vision towers of such a
  model's modeling module make one call per layer (their attention classes' ``forward`` is wrapped). Models that do
  not choose "omni" are untouched: the wrappers hand them Transformers' own answer and forward.

Opt out of the patches with the environment variable ``OMNI_HF_NO_PATCH=1`` (read at import) or
``omni_hf.register(patch=False)`` (which also removes patches already installed). "omni" stays registered; models are
then not checked at build (what omni cannot run raises at the first forward), towers that keep their own attention
must be named by the user beside every other sub-config (``attn_implementation={"": "omni", "text_config": "omni",
"audio_config": "eager", ...}``), and packed vision towers make one call per image. See README.md beside this file.
"""

from __future__ import annotations

import os

from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from . import patches
from .attention import omni_attention_forward
from .packed_towers import PACKED
from .spec import OmniMaskSpec, omni_mask

__all__ = ["NO_PATCH_ENV", "OmniMaskSpec", "omni_attention_forward", "omni_mask", "register"]

NO_PATCH_ENV = "OMNI_HF_NO_PATCH"


def register(patch: bool | None = None) -> None:
    """Register "omni" in Transformers' attention and mask interfaces and install or remove `patches` (idempotent).

    Args:
        patch: install the patches (True) or remove them (False); None: install them unless the environment
            variable ``OMNI_HF_NO_PATCH`` is "1".
    """
    AttentionInterface.register("omni", omni_attention_forward)
    AttentionInterface.register(PACKED, omni_attention_forward)
    AttentionMaskInterface.register("omni", omni_mask)
    if patch is None:
        patch = os.environ.get(NO_PATCH_ENV, "0") != "1"
    if patch:
        patches.install()
    else:
        patches.remove()
