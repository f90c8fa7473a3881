"""README.md's and docs/*.md's code blocks work as written, so they cannot rot.

Each ```python block runs in a fresh interpreter with a temporary directory as its working directory (the
repository on PYTHONPATH, for blocks that import `examples`; Hugging Face's hub offline: no block may download).
A ```python gpu block runs only where CUDA is available. Each ```bash block's commands must name things that exist:
`python3 -m` modules and scripts answer ``--help`` (listing the options the block passes), extras in ``.[...]`` are
declared in pyproject.toml, other programs are on PATH, and pip is always run as ``python3 -m pip``.
Relative links in these documents, in docs/ below them and in the benchmarks READMEs point to files; benchmarks/results
holds only figures and reports (no scripts, no logs), each named by its folder's README or a document.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib
import torch

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RESULTS = ROOT / "benchmarks" / "results"
LINKED_DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "benchmarks" / "README.md",
                    *sorted(RESULTS.glob("*/README.md"))]
RESULTS_FILE_LIMIT = 80  # benchmarks/results is the record of current figures; logs and superseded runs live in git
RESULT_SUFFIXES = {".json", ".png", ".md", ".txt"}  # figures and reports: no scripts, no logs
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^`\n]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
PYTHON_INFOS = {"python", "python gpu"}  # every python fence says one of these: nothing is skipped silently
BLOCK_TIMEOUT_S = 600
HELP_TIMEOUT_S = 300


@dataclass(frozen=True)
class CodeBlock:
    """One fenced block: the document, its first line (1-based), the fence's info string and the code."""

    document: Path
    line: int
    info: str
    code: str

    @property
    def name(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"


def code_blocks(document: Path) -> list[CodeBlock]:
    """The fenced blocks of ``document``, a list item's indentation removed from their lines."""
    text = document.read_text()
    blocks = []
    for match in FENCE.finditer(text):
        indent = match["indent"]
        code = "".join(line[len(indent):] if line.startswith(indent) else line
                       for line in match["body"].splitlines(keepends=True))
        blocks.append(CodeBlock(document, text.count("\n", 0, match.start()) + 1, match["info"].strip(), code))
    return blocks


BLOCKS = [block for document in DOCUMENTS for block in code_blocks(document)]
PYTHON_BLOCKS = [block for block in BLOCKS if block.info.split(" ")[0] == "python"]
BASH_BLOCKS = [block for block in BLOCKS if block.info == "bash"]


def commands(script: str) -> list[list[str]]:
    """The commands of a bash block as argument lists: continuation lines joined, comments dropped, leading
    ``NAME=value`` assignments removed."""
    joined = re.sub(r"\\\n", " ", script)
    result = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
            words = words[1:]
        if words:
            result.append(words)
    return result


def declared_extras() -> set[str]:
    with open(ROOT / "pyproject.toml", "rb") as file:
        return set(tomllib.load(file)["project"]["optional-dependencies"])


@functools.cache
def answers_help(*command: str) -> subprocess.CompletedProcess:
    """``command --help`` run with this interpreter from the repository root."""
    return subprocess.run([sys.executable, *command, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=HELP_TIMEOUT_S)


def check_command(words: list[str]) -> None:
    """Asserts that the program, module, script or extras one bash command names exist."""
    program = words[0]
    assert program != "pip", f"{shlex.join(words)!r}: run pip as `python3 -m pip` (a bare pip may be another Python's)"
    if program in ("python", "python3"):
        if words[1] == "-m":
            check_module(words[2], words[3:])
        else:
            check_script(words[1], words[2:])
    elif program == "torchrun":
        assert shutil.which("torchrun"), "torchrun is not on PATH"
        script = next(i for i, word in enumerate(words) if word.endswith(".py"))
        check_script(words[script], words[script + 1:])
    else:
        assert shutil.which(program), f"{program!r} is not on PATH"


def check_module(module: str, arguments: list[str]) -> None:
    if module == "pip":
        for word in arguments:
            if extras := re.search(r"\[([\w,-]+)\]$", word):  # ".[test,train]", "omni_hf-*.whl[sft]"
                unknown = set(extras[1].split(",")) - declared_extras()
                assert not unknown, f"{word}: extras {sorted(unknown)} are not declared in pyproject.toml"
    elif module == "pytest":
        paths = [word for word in arguments if not word.startswith("-")]
        assert all((ROOT / path).exists() for path in paths), f"pytest paths {paths} do not all exist"
    else:
        done = answers_help("-m", module)
        assert done.returncode == 0, f"python3 -m {module} --help failed:\n{done.stderr[-3000:]}"


def check_script(path: str, arguments: list[str]) -> None:
    """The script exists, answers ``--help`` and lists every ``--option`` the command passes it."""
    assert (ROOT / path).is_file(), f"{path} does not exist"
    done = answers_help(path)
    assert done.returncode == 0, f"python3 {path} --help failed:\n{done.stderr[-3000:]}"
    unknown = [word for word in arguments if word.startswith("--") and word not in done.stdout]
    assert not unknown, f"{path} --help does not list {unknown}"


def test_documents_have_code_blocks():
    assert PYTHON_BLOCKS and BASH_BLOCKS, "no code blocks found: the fence pattern no longer matches the documents"


@pytest.mark.parametrize("block", [block for block in BLOCKS if block.info.startswith("python")],
                         ids=lambda block: block.name)
def test_python_fences_say_whether_they_need_a_gpu(block):
    assert block.info in PYTHON_INFOS, f"{block.name}: fence info {block.info!r}, expected one of {PYTHON_INFOS}"


@pytest.mark.slow
@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=lambda block: block.name)
def test_python_block_runs(block, tmp_path):
    if block.info == "python gpu" and not torch.cuda.is_available():
        pytest.skip("a GPU block, and CUDA is not available")
    script = tmp_path / "block.py"
    script.write_text(block.code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=BLOCK_TIMEOUT_S)
    assert done.returncode == 0, f"{block.name} failed:\n{block.code}\n--- stderr ---\n{done.stderr[-4000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("block", BASH_BLOCKS, ids=lambda block: block.name)
def test_bash_block_names_what_exists(block):
    for words in commands(block.code):
        check_command(words)


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda document: str(document.relative_to(ROOT)))
def test_pip_is_run_through_the_interpreter(document):
    bare = [line for line in document.read_text().splitlines() if re.search(r"(?<!-m )\bpip install", line)]
    assert not bare, f"{document.name}: pip run bare (write `python3 -m pip`):\n" + "\n".join(bare)


@pytest.mark.parametrize("document", LINKED_DOCUMENTS, ids=lambda document: str(document.relative_to(ROOT)))
def test_relative_links_point_to_files(document):
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", document.read_text())
    missing = [target for target in targets if "://" not in target and not (document.parent / target).exists()]
    assert not missing, f"{document.name} links to paths that do not exist: {missing}"


def expand_braces(name: str) -> list[str]:
    """``a_{x,y}.{json,png}`` -> the names it stands for (as the shell expands it)."""
    match = re.search(r"\{([^{}]*)\}", name)
    if not match:
        return [name]
    return [expanded for choice in match[1].split(",")
            for expanded in expand_braces(name[:match.start()] + choice + name[match.end():])]


def cited_names(text: str) -> set[str]:
    """Every file name written in backticks or as a link target in ``text``, braces expanded, folders dropped."""
    words = re.findall(r"`([^`\s]+)`", text) + re.findall(r"\]\(([^)#\s]+)", text)
    return {Path(name).name for word in words for name in expand_braces(word)}


def result_files() -> list[Path]:
    """The files under benchmarks/results that git tracks (all of them outside a git checkout)."""
    done = subprocess.run(["git", "ls-files", "-z", str(RESULTS)], cwd=ROOT, capture_output=True, text=True)
    if done.returncode == 0 and done.stdout:
        return [ROOT / path for path in done.stdout.split("\0") if path]
    return [path for path in RESULTS.rglob("*") if path.is_file()]


def test_results_hold_only_cited_figures():
    files = result_files()
    limit = RESULTS_FILE_LIMIT
    assert len(files) <= limit, f"benchmarks/results holds {len(files)} files, expected at most {limit}"
    odd = [str(path.relative_to(ROOT)) for path in files if path.suffix not in RESULT_SUFFIXES]
    assert not odd, f"benchmarks/results holds files other than {sorted(RESULT_SUFFIXES)}: {odd}"
    everywhere = cited_names("\n".join(document.read_text() for document in LINKED_DOCUMENTS))
    uncited = [str(path.relative_to(ROOT)) for path in files if path.name != "README.md"
               and path.name not in cited_names((path.parent / "README.md").read_text()) | everywhere]
    assert not uncited, f"files under benchmarks/results that no README or doc names: {uncited}"
    assert all((folder / "README.md").is_file() for folder in RESULTS.iterdir() if folder.is_dir())
