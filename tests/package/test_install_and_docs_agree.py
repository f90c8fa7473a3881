"""What a new user copies: CI installs exactly what README.md says, the CPU install pulls no build-only package, the
documents' code blocks do not depend on the directory they run from, and README lists every key the collator
returns."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import tomllib
import torch

from omni_hf import OmniCollator, VisionInputs

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BUILD_ONLY = ("nvidia-cutlass", "cuda-python", "scipy", "pydot")


def ci_installs() -> list[str]:
    """The pip commands of .ci/run that install the environment (not the oldest Transformers beside it)."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    return [re.search(r"python3 -m pip install [^;]*", line)[0].strip() for line in lines
            if "python3 -m pip install" in line and "--target" not in line]


def test_ci_installs_what_the_readme_says():
    commands = ci_installs()
    assert commands, ".ci/run installs nothing"
    for command in commands:
        said = f"`{command}`" in README or f"{command}   " in README  # inline, or a block's command and comment
        assert said, f".ci/run runs {command!r}; README does not say it"
    first = re.search(r"```bash\n(python3 -m pip install [^#\n]*?)\s*#", README)[1]
    assert first == commands[0], f"README's first command {first!r} is not what CI installs first {commands[0]!r}"


def test_readme_first_install_pulls_no_build_only_package():
    first = re.search(r"```bash\n(python3 -m pip install [^#\n]*?)\s*#", README)[1]
    extras = re.search(r"\.\[([\w,-]+)\]", first)[1].split(",")
    with open(ROOT / "pyproject.toml", "rb") as file:
        project = tomllib.load(file)["project"]
    packages = project["dependencies"] + [p for extra in extras for p in project["optional-dependencies"][extra]]
    pulled = [p for p in packages if re.match("|".join(BUILD_ONLY), p)]
    assert not pulled, f"the CPU install pulls build-only packages {pulled}"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda document: document.name)
def test_code_blocks_do_not_import_the_repository_layout(document):
    """``import examples...`` works only from the repository root; a block must run from any directory."""
    blocks = re.findall(r"```python[^\n]*\n(.*?)```", document.read_text(), re.S)
    bad = [line for block in blocks for line in block.splitlines()
           if re.match(r"\s*(from|import)\s+(examples|tests|benchmarks|training)\b", line)]
    assert not bad, f"{document.name}: blocks import the repository's folders as packages: {bad}"


def readme_batch_keys() -> set[str]:
    """The keys named in the first column of README's table of the collator's batch."""
    table = README[README.index("| key | when | what |"):]
    table = table[:table.index("\n\n")]
    return {key for row in table.splitlines()[2:] for key in re.findall(r"`([\w<>]+)`", row.split("|")[1])}


def test_readme_names_every_key_the_collator_returns():
    rng = np.random.default_rng(0)
    samples = [{"input_ids": rng.integers(3, 100, n).tolist(), "modality_spans": [(1, 4)] if n > 8 else [],
                "pixel_values": torch.randn(int(n > 8), 3, 2, 2), "prompt_length": 1} for n in (12, 5, 20)]
    keys = set()
    for mode in ("pad", "pack"):
        keys |= set(OmniCollator(0, mode=mode, max_length=64, return_block_mask=True, train_on_prompt=False)(samples))
    vision = VisionInputs(image_token_ids=(2,), token_keys=("token_type_ids",), image_keys={"pixel_values": 0},
                          count_key="pixel_values")
    image_samples = [{"input_ids": [5, 2, 2, 6, 7], "token_type_ids": [0, 1, 1, 0, 0],
                      "pixel_values": torch.randn(1, 3, 2, 2)}, {"input_ids": [8, 9, 4]}]
    keys |= set(OmniCollator(0, vision=vision)(image_samples))
    named = readme_batch_keys()
    generic = {key for key in keys if key.endswith("_sample_index") and "<key>_sample_index" in named}
    missing = sorted(keys - named - generic)
    assert not missing, f"README's table of batch keys lacks {missing}"
