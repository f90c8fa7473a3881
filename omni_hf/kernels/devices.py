"""Which GPUs run which kernels, from the generated table (`omni_hf.kernels.table`), in one place.

A GPU of compute capability 9.0 runs the sm_90a kernels where they take a call and the portable sm_80 family
elsewhere; every other GPU from 8.0 on runs the sm_80 family (as SASS on 8.x, 10.x and 12.x, JIT-compiled from its
PTX on any later GPU); below 8.0 the kernels cannot run (their mma.sync shapes, bf16 and cp.async need Ampere).
The library's dispatch reads the same table (``csrc/host/table.h``).
"""

from __future__ import annotations

import torch

from . import table

__all__ = ["capability_reason", "device_targets", "smem_reason"]

# The shared memory one block may opt into, where torch does not report it.
_KNOWN_SMEM_PER_BLOCK = {(8, 0): 163 * 1024, (9, 0): 227 * 1024}
_FALLBACK_SMEM_PER_BLOCK = 99 * 1024  # the least of the GPUs from 8.0 on (8.6, 8.9, 12.x)


def capability_reason(capability: tuple[int, int]) -> str | None:
    """Why a GPU of ``capability`` (major, minor) runs no kernel, or None when it runs them."""
    if tuple(capability) >= table.MIN_CAPABILITY:
        return None
    lowest = ".".join(map(str, table.MIN_CAPABILITY))
    return (f"compute capability {capability[0]}.{capability[1]} is below {lowest}: the kernels need Ampere or later "
            "(mma.sync bf16 tiles, cp.async), so the PyTorch reference runs")


def _runs(target: str, capability: tuple[int, int]) -> bool:
    """Whether a GPU of ``capability`` runs the code of a build target: SASS of its major version and a minor not
    above its own, PTX of a capability not above its own; an arch-specific ("a") target on its capability only."""
    code = target.split("_")[1]
    major, minor = divmod(int(code.rstrip("a")), 10)
    if code.endswith("a"):
        return (major, minor) == tuple(capability)
    if target.startswith("sm_"):
        return major == capability[0] and minor <= capability[1]
    return (major, minor) <= tuple(capability)


def device_targets(capability: tuple[int, int]) -> tuple[str, ...]:
    """The build targets that serve a GPU of ``capability`` (for a build of the current GPU only): per kernel family
    the newest SASS it runs, else the PTX it JIT-compiles; empty below `table.MIN_CAPABILITY`."""
    chosen: list[str] = []
    for targets in table.BUILD_TARGETS.values():
        sass = [t for t in targets if t.startswith("sm_") and _runs(t, capability)]
        ptx = [t for t in targets if t.startswith("compute_") and _runs(t, capability)]
        chosen += [t for t in (sass[-1:] or ptx[:1]) if t not in chosen]
    return tuple(chosen)


def smem_per_block(device_index: int) -> int:
    """The shared memory one block may opt into on the device, in bytes."""
    props = torch.cuda.get_device_properties(device_index)
    known = _KNOWN_SMEM_PER_BLOCK.get((props.major, props.minor), _FALLBACK_SMEM_PER_BLOCK)
    return getattr(props, "shared_memory_per_block_optin", None) or known


def smem_reason(device_index: int, kernel_head_dim: int, block_q: int, block_kv: int) -> str | None:
    """Why the sm_80 kernels of a call (an instantiated head dim, the mask's block sizes) cannot run on the device
    for want of shared memory, or None. The sm_90a kernels fit every GPU they run on; the sm_80 ones are every
    call's fallback, so a call needs the larger of their forward and backward."""
    need = max(table.SM80_SMEM_BYTES["fwd"][kernel_head_dim, block_q],
               table.SM80_SMEM_BYTES["bwd"][kernel_head_dim, block_kv])
    granted = smem_per_block(device_index)
    if need <= granted:
        return None
    return (f"head dim {kernel_head_dim} with blocks {block_q}x{block_kv}: the sm_80 kernels need {need // 1024} KB "
            f"of shared memory per block, this GPU grants {granted // 1024} KB")
