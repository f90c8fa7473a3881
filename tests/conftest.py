"""The ``gpu`` marker: a test that needs a CUDA device and the omni_hf CUDA library is skipped, with one reason,
where the library is not available."""

from __future__ import annotations

import pytest

from omni_hf.ops import library

NO_LIBRARY = "needs a CUDA device and the omni_hf CUDA library"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if library.available():
        return
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(pytest.mark.skip(reason=NO_LIBRARY))
