"""Which GPUs run which kernels (CPU-only): the build targets of each kernel family, those a build for one GPU
chooses, the compute capability below which the reference runs, and the shared memory check that sends a call
the sm_80 kernels cannot fit on a GPU to the reference. The compile checks skip without nvcc or the CUTLASS headers."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from omni_hf import build
from omni_hf.kernels import devices, table

PORTABLE = ("sm_80", "sm_90a", "sm_100", "sm_120", "compute_80")


@pytest.mark.parametrize("capability, targets", [
    ((8, 0), ("sm_80",)), ((8, 6), ("sm_80",)), ((8, 9), ("sm_80",)),  # A100, RTX 30xx, RTX 40xx / L4
    ((9, 0), ("sm_90a",)),  # H100 / H200: both families from sm_90a SASS
    ((10, 0), ("sm_100",)), ((10, 3), ("sm_100",)),  # B200, B300: SASS of 10.0 runs on later 10.x
    ((12, 0), ("sm_120",)), ((12, 1), ("sm_120",)),  # RTX 50xx, DGX Spark
    ((11, 0), ("compute_80",)), ((13, 0), ("compute_80",)),  # no SASS: the portable PTX, JIT-compiled
    ((7, 5), ()), ((7, 0), ()),  # T4, V100: nothing runs
])
def test_a_build_for_one_gpu_takes_the_targets_that_gpu_runs(capability, targets):
    assert devices.device_targets(capability) == targets


def test_the_families_embed_sass_for_each_generation_and_ptx_for_later_gpus():
    assert table.BUILD_TARGETS == {"sm80": PORTABLE, "sm90": ("sm_90a", "compute_90a")}
    assert build.DEFAULT_ARCHS == (*PORTABLE, "compute_90a")


@pytest.mark.parametrize("capability", [(7, 0), (7, 5)])
def test_below_compute_capability_8_the_reason_names_the_reference(capability):
    reason = devices.capability_reason(capability)
    assert f"compute capability {capability[0]}.{capability[1]} is below 8.0" in reason and "reference" in reason


@pytest.mark.parametrize("capability", [(8, 0), (8, 6), (9, 0), (10, 0), (12, 0), (13, 0)])
def test_from_compute_capability_8_the_kernels_run(capability):
    assert devices.capability_reason(capability) is None


def fake_gpu(monkeypatch, major: int, minor: int, smem_optin: int) -> None:
    props = SimpleNamespace(major=major, minor=minor, shared_memory_per_block_optin=smem_optin)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)


def needs_smem(head_dim: int, block_q: int, block_kv: int) -> int:
    """What the sm_80 kernels of such a call need, from the table: the larger of forward and backward."""
    return max(table.SM80_SMEM_BYTES["fwd"][head_dim, block_q], table.SM80_SMEM_BYTES["bwd"][head_dim, block_kv])


@pytest.mark.parametrize("name, capability, optin", [
    ("RTX 5090", (12, 0), 101376), ("RTX 4090", (8, 9), 101376), ("A100", (8, 0), 166912), ("H100", (9, 0), 232448),
])
def test_a_call_the_sm80_kernels_cannot_fit_gets_a_reason_from_the_gpus_shared_memory(monkeypatch, name, capability,
                                                                                     optin):
    fake_gpu(monkeypatch, *capability, optin)
    for head_dim in table.HEAD_DIMS:
        for block_q in table.BLOCK_SIZES:
            for block_kv in table.BLOCK_SIZES:
                reason = devices.smem_reason(0, head_dim, block_q, block_kv)
                need = needs_smem(head_dim, block_q, block_kv)
                assert (reason is None) == (need <= optin), (name, head_dim, block_q, block_kv)
                if reason is not None:
                    assert f"need {need // 1024} KB" in reason and f"grants {optin // 1024} KB" in reason


def test_what_each_gpu_class_runs_on_the_kernels(monkeypatch):
    """The figures the README's GPU table states: 99 KB GPUs run head dim 64 at any blocks and 96 with 64-key blocks;
    the A100 every head dim up to 128; the H100 all of them."""
    def fits(optin):
        fake_gpu(monkeypatch, 8, 0, optin)
        return {(d, bq, bk) for d in table.HEAD_DIMS for bq in table.BLOCK_SIZES for bk in table.BLOCK_SIZES
                if devices.smem_reason(0, d, bq, bk) is None}

    blocks = {(bq, bk) for bq in table.BLOCK_SIZES for bk in table.BLOCK_SIZES}
    assert fits(101376) == {(64, bq, bk) for bq, bk in blocks} | {(96, bq, 64) for bq in table.BLOCK_SIZES}
    assert fits(166912) == {(d, bq, bk) for d in (64, 96, 128) for bq, bk in blocks}
    assert fits(232448) == {(d, bq, bk) for d in table.HEAD_DIMS for bq, bk in blocks}


def test_each_source_compiles_for_its_familys_targets():
    sm90 = build.CSRC / "sm90" / "inst" / "fwd_bf16_hdim128.cu"
    for portable in ("sm80/inst/fwd_bf16_hdim128.cu", "decode/decode.cu", "host/fwd_api.cu", "host/torch_ops.cpp"):
        assert build.source_targets(build.CSRC / portable, build.DEFAULT_ARCHS) == PORTABLE
    assert build.source_targets(sm90, build.DEFAULT_ARCHS) == ("sm_90a", "compute_90a")
    # a build for one GPU: the sm_90a sources compile as stubs where it is not a 9.0 one, so that the library links
    assert build.source_targets(sm90, ("sm_120",)) == ("sm_120",)
    assert build.gencode_flags(("sm_100", "compute_80")) == ["-gencode=arch=compute_100,code=sm_100",
                                                            "-gencode=arch=compute_80,code=compute_80"]
    assert build.normalized_archs(("80", "90a", "compute_80")) == ("sm_80", "sm_90a", "compute_80")
    with pytest.raises(build.BuildError, match="archs: expected targets"):
        build.normalized_archs(("sm_eighty",))


def needs_nvcc() -> str:
    nvcc = build.find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found")
    return nvcc


def test_nvcc_builds_every_target_of_the_table():
    nvcc = needs_nvcc()
    codes = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, check=True).stdout.split()
    virtual = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, check=True).stdout.split()
    for target in build.DEFAULT_ARCHS:
        base = target.rstrip("a")  # nvcc lists sm_90 and compute_90 for the arch-specific sm_90a / compute_90a
        assert base in (codes if target.startswith("sm_") else virtual), target


@pytest.mark.slow
def test_a_portable_source_carries_sass_for_each_generation_and_ptx(tmp_path):
    """decode/split_kv.cu (the smallest source with a kernel) built with the default targets: cuobjdump lists an ELF
    image for sm_80, sm_90a, sm_100 and sm_120 and the compute_80 PTX."""
    nvcc = needs_nvcc()
    cuobjdump = shutil.which("cuobjdump") or shutil.which("cuobjdump", path=str(Path(nvcc).parent))
    if cuobjdump is None:
        pytest.skip("cuobjdump not found (beside nvcc or on PATH)")
    try:
        build.find_cutlass_include()
    except build.BuildError as err:
        pytest.skip(str(err))
    [obj] = build.compile_objects(tmp_path, jobs=1, only="decode/split_kv.cu")
    listing = subprocess.run([cuobjdump, "--list-elf", "--list-ptx", str(obj)], capture_output=True, text=True,
                             check=True).stdout
    elf = {line.rsplit(".", 2)[-2] for line in listing.splitlines() if line.startswith("ELF file")}
    ptx = {line.rsplit(".", 2)[-2] for line in listing.splitlines() if line.startswith("PTX file")}
    assert elf == {"sm_80", "sm_90a", "sm_100", "sm_120"} and ptx == {"sm_80"}, listing
