"""setuptools hook: `python -m pip install .` (regular or editable) also builds the CUDA library when it can.

Metadata lives in pyproject.toml. The build runs when nvcc, the CUTLASS headers and torch's headers are found and a
GPU driver is present; OMNI_HF_BUILD_CUDA=1 forces it (e.g. a wheel built on a machine without a GPU) and =0 skips
it. The library goes where `omni_hf.kernels.loader` looks first, ``omni_hf/lib/``: into the wheel (a platform wheel,
``py3-none-<platform>``: the library uses no Python C API) or, for an editable install, into the source tree. So an
install builds once and the first call loads it. Without it the package installs as pure Python and the first
use on a GPU builds the library into a cache directory.

Knobs: OMNI_HF_BUILD_ARCHS (build targets, e.g. "sm_80,sm_90a"; default: every target of
``omni_hf/kernels/table.py``, as ``python -m omni_hf.build`` builds, so the wheel and an editable install carry the same
set: SASS for 8.x, 9.0, 10.x and 12.x, PTX for later GPUs), OMNI_HF_BUILD_SOURCES (a glob of csrc/ sources to build,
for tests).
"""

import ctypes
import importlib.util
import os
import sysconfig
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _load_build_module():
    """omni_hf/build.py on its own (importing the package would need torch in the build environment)."""
    spec = importlib.util.spec_from_file_location("omni_hf_build", ROOT / "omni_hf" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _gpu_driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def _should_build(build) -> tuple[bool, str]:
    choice = os.environ.get("OMNI_HF_BUILD_CUDA", "auto")
    if choice == "0":
        return False, "OMNI_HF_BUILD_CUDA=0"
    if build.find_nvcc() is None:
        return False, "nvcc not found"
    try:
        build.find_cutlass_include()
        build.find_torch_include()
    except build.BuildError as err:
        return False, str(err)
    if choice == "1":
        return True, "OMNI_HF_BUILD_CUDA=1"
    if not _gpu_driver_present():
        return False, "no GPU driver (set OMNI_HF_BUILD_CUDA=1 to build anyway)"
    return True, "nvcc and a GPU driver found"


BUILD = _load_build_module()
WANTED, WHY = _should_build(BUILD)


class BuildPyWithCuda(build_py):
    """build_py that also compiles csrc/ into omni_hf/lib/libomni_hf_cuda.so of the build (or, editable, of the
    source tree)."""

    def run(self):
        super().run()
        if not WANTED:
            print(f"omni_hf: not building the CUDA library ({WHY}); it will be built on first use")
            return
        root = ROOT if self.editable_mode else Path(self.build_lib)
        archs = BUILD.parse_archs(os.environ.get("OMNI_HF_BUILD_ARCHS", "")) or BUILD.DEFAULT_ARCHS
        print(f"omni_hf: building the CUDA library ({WHY}) into {root / 'omni_hf' / 'lib'}")
        BUILD.build(root / "omni_hf" / "lib", archs, only=os.environ.get("OMNI_HF_BUILD_SOURCES"))


def wheel_options() -> dict:
    """A wheel holding the library is tagged ``py3-none-<platform>`` (any Python 3, this OS and CPU): the
    distribution stays pure Python, whose wheels take the ``py3-none`` tags, and names its platform. Only options,
    no subclass of ``bdist_wheel``: that command moved from the ``wheel`` package into setuptools 70.1, and this
    works with either (setuptools >= 64)."""
    if not WANTED:
        return {}
    return {"bdist_wheel": {"plat_name": sysconfig.get_platform()}}


setup(cmdclass={"build_py": BuildPyWithCuda}, options=wheel_options())
