"""CPU-only checks of the CUDA library's build: the ctypes mirror matches the C header byte for byte, and one
kernel instantiation compiles with nvcc for sm_80 (skipped where nvcc or the CUTLASS headers are absent)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest

from omni_hf import _cuda, build

STRUCTS = (_cuda.OmniTensor, _cuda.OmniBlockList, _cuda.OmniMask, _cuda.OmniFwdParams, _cuda.OmniBwdParams)


def _c_layout(tmp_path) -> dict[str, int]:
    """sizeof of each struct and offsetof of each field, as the C compiler lays out omni_attention.h."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    lines = []
    for struct in STRUCTS:
        name = struct.__name__
        lines.append(f'printf("{name} %zu\\n", sizeof({name}));')
        lines += [f'printf("{name}.{f} %zu\\n", offsetof({name}, {f}));' for f, _ in struct._fields_]
    src = tmp_path / "layout.c"
    src.write_text('#include <stdio.h>\n#include <stddef.h>\n#include "omni_attention.h"\n'
                   "int main(void) {\n" + "\n".join(lines) + "\nreturn 0;\n}\n")
    exe = tmp_path / "layout"
    subprocess.run([compiler, f"-I{build.CSRC}", str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return {key: int(value) for key, value in (line.split() for line in out.splitlines())}


def _ctypes_layout() -> dict[str, int]:
    layout = {}
    for struct in STRUCTS:
        layout[struct.__name__] = ctypes.sizeof(struct)
        layout.update({f"{struct.__name__}.{f}": getattr(struct, f).offset for f, _ in struct._fields_})
    return layout


def test_ctypes_structs_match_the_c_header_layout(tmp_path):
    assert _ctypes_layout() == _c_layout(tmp_path)


def test_ctypes_abi_version_matches_the_header():
    header = (build.CSRC / "omni_attention.h").read_text()
    assert f"#define OMNI_ABI_VERSION {_cuda.ABI_VERSION}\n" in header


def test_source_hash_changes_with_the_target_arch():
    assert build.source_hash(("80",)) != build.source_hash(("90a",))


def test_one_forward_instantiation_compiles_for_sm80(tmp_path):
    if build.find_nvcc() is None:
        pytest.skip("nvcc not found")
    try:
        build.find_cutlass_include()
    except build.BuildError as err:
        pytest.skip(str(err))
    [obj] = build.compile_objects(tmp_path, archs=("80",), jobs=2, only="inst/fwd_bf16_hdim128.cu")
    assert obj.stat().st_size > 0
