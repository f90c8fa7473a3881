"""setuptools hook: `pip install .` also builds the CUDA library into omni_hf/lib/ when it can.

Metadata lives in pyproject.toml. The build runs when nvcc and the CUTLASS headers are found and a GPU driver
is present; OMNI_HF_BUILD_CUDA=1 forces it (e.g. building wheels on a machine without a GPU) and =0 skips it.
Without it the package installs as pure Python and the first use builds the library into a cache directory.
"""

import ctypes
import importlib.util
import os
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
    except build.BuildError as err:
        return False, str(err)
    if choice == "1":
        return True, "OMNI_HF_BUILD_CUDA=1"
    if not _gpu_driver_present():
        return False, "no GPU driver (set OMNI_HF_BUILD_CUDA=1 to build anyway)"
    return True, "nvcc and a GPU driver found"


class BuildPyWithCuda(build_py):
    """build_py that also compiles csrc/ into <build_lib>/omni_hf/lib/libomni_hf_cuda.so."""

    def run(self):
        super().run()
        build = _load_build_module()
        wanted, why = _should_build(build)
        if not wanted:
            print(f"omni_hf: not building the CUDA library ({why}); it will be built on first use")
            return
        print(f"omni_hf: building the CUDA library ({why})")
        build.build(Path(self.build_lib) / "omni_hf" / "lib")


setup(cmdclass={"build_py": BuildPyWithCuda})
