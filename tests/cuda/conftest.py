"""Fixtures of the CUDA kernel tests; a module opts in with ``pytest.mark.usefixtures``."""

from __future__ import annotations

import pytest

from omni_hf.ops import library
from tests.helpers.gpu_paths import is_hopper


@pytest.fixture(params=("sm90", "sm80") if is_hopper() else ("default",))
def kernel_path(request, monkeypatch) -> str:
    """"sm90" (Hopper kernels where they apply), "sm80" (switched off) or "default" (not a Hopper GPU)."""
    if request.param == "sm80":
        monkeypatch.setenv("OMNI_HF_DISABLE_SM90", "1")
    else:
        monkeypatch.delenv("OMNI_HF_DISABLE_SM90", raising=False)
    return request.param


@pytest.fixture
def poisoned_outputs():
    """The library fills its outputs with NaN before each call, so that an element a kernel leaves unwritten shows."""
    library.set_poison_outputs(True)
    yield
    library.set_poison_outputs(False)
