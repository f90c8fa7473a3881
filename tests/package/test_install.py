"""Install paths build the CUDA library once, where the first call looks (CPU-only; skipped without nvcc or the
CUTLASS / torch headers). Each test installs a copy of the project into a fresh virtual environment that sees this
one's packages, with the build forced (OMNI_HF_BUILD_CUDA=1 works without a GPU) and cut down to one small source
(OMNI_HF_BUILD_SOURCES) to stay fast, then asks the installed omni_hf which library its first call would load. The
copy takes the files git would list, found without git (`project_files`), so the tests also run in a release tarball
or an sdist."""

from __future__ import annotations

import fnmatch
import os
import shutil
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from omni_hf import build

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture
def project(tmp_path) -> Path:
    """A copy of the tracked project files (an editable install writes into its source tree)."""
    if build.find_nvcc() is None:
        pytest.skip("nvcc not found")
    try:
        build.find_cutlass_include()
        build.find_torch_include()
    except build.BuildError as err:
        pytest.skip(str(err))
    copy = tmp_path / "project"
    for name in project_files(ROOT):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, copy / name)
    return copy


def ignore_rules(root: Path) -> list[tuple[str, bool, bool]]:
    """The root .gitignore as (glob, anchored at the root, folders only) rules; raises ValueError on a form this
    reader does not take (negation, a slash inside the pattern)."""
    path = root / ".gitignore"
    lines = path.read_text().splitlines() if path.is_file() else []
    rules = []
    for line in (raw.strip() for raw in lines):
        if not line or line.startswith("#"):
            continue
        anchored, folder, pattern = line.startswith("/"), line.endswith("/"), line.strip("/")
        if line.startswith("!") or "/" in pattern:
            raise ValueError(f"{path}: the pattern {line!r} is beyond this reader (names and globs only)")
        rules.append((pattern, anchored, folder))
    return rules


def project_files(root: Path) -> list[str]:
    """The files of the project at ``root`` that git would list (tracked, or untracked and not ignored), relative
    and sorted, found by walking the tree without git: ``.git`` and what the root .gitignore ignores left out."""
    rules = ignore_rules(root)

    def ignored(parts: tuple[str, ...], is_dir: bool) -> bool:
        return parts[-1] == ".git" or any(fnmatch.fnmatch(parts[-1], pattern) and (is_dir or not folder)
                                          and (len(parts) == 1 or not anchored) for pattern, anchored, folder in rules)

    files = []
    for folder, dirs, names in os.walk(root):
        here = Path(folder).relative_to(root).parts
        dirs[:] = [d for d in dirs if not ignored((*here, d), True)]
        files += [str(Path(*here, n)) for n in names if not ignored((*here, n), False)]
    return sorted(files)


def test_the_file_walk_lists_what_git_lists():
    """In a git checkout, `project_files` agrees with ``git ls-files -co --exclude-standard`` (files that exist)."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: nothing to compare the walk with")
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split()
    assert project_files(ROOT) == sorted(name for name in listed if (ROOT / name).is_file())


def environment(tmp_path: Path) -> tuple[Path, dict]:
    """A fresh venv that sees the packages of the environment running the tests (torch, setuptools, the CUTLASS
    headers: whatever versions this environment has, not the base interpreter's) after its own, and the environment
    of a forced, cut-down build."""
    home = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(home)
    python = home / "bin" / "python"
    own_packages = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                  capture_output=True, text=True, check=True).stdout.strip()
    (Path(own_packages) / "running_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {**os.environ, "OMNI_HF_BUILD_CUDA": "1", "OMNI_HF_BUILD_SOURCES": "host/status.cu",
           "OMNI_HF_BUILD_ARCHS": "80", "OMNI_HF_CACHE": str(tmp_path / "cache"), "PYTHONNOUSERSITE": "1"}
    env.pop("OMNI_HF_CUDA_LIB", None)
    return python, env


def pip(python: Path, env: dict, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), *args, "--no-deps", "--no-build-isolation",
                    "--quiet"], env=env, check=True)


def first_call_library(python: Path, env: dict, cwd: Path) -> Path:
    """The library the installed omni_hf would load first (resolving it builds nothing when one was installed)."""
    out = subprocess.run([str(python), "-c", "from omni_hf.kernels import loader; print(loader.library_path())"],
                         env=env, cwd=cwd, capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def test_editable_install_builds_into_the_tree_and_the_first_call_loads_that(project, tmp_path):
    python, env = environment(tmp_path)
    pip(python, env, "install", "-e", str(project))
    library = first_call_library(python, env, tmp_path)
    assert library == project / "omni_hf" / "lib" / build.LIB_NAME and library.is_file()
    assert not (tmp_path / "cache").exists(), "the first call would build a second library"


def test_regular_install_puts_the_library_in_the_package(project, tmp_path):
    python, env = environment(tmp_path)
    pip(python, env, "install", str(project))
    library = first_call_library(python, env, tmp_path)
    assert "site-packages" in library.parts and library.is_file()
    assert not (tmp_path / "cache").exists(), "the first call would build a second library"


def test_wheel_is_a_platform_wheel_holding_the_library_and_no_objects(project, tmp_path):
    python, env = environment(tmp_path)
    pip(python, env, "wheel", str(project), "--wheel-dir", str(tmp_path / "dist"))
    [wheel] = (tmp_path / "dist").glob("omni_hf-*.whl")
    assert wheel.name.endswith("-py3-none-linux_x86_64.whl"), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert f"omni_hf/lib/{build.LIB_NAME}" in names
    assert not [n for n in names if n.endswith(".o")], "object files leaked into the wheel"
