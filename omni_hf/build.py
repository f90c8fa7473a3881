"""Build the omni_hf CUDA library (``libomni_hf_cuda.so``) with nvcc.

    python -m omni_hf.build [--arch sm_80,sm_90a,...] [--jobs N] [--only PATTERN] [--out DIR]

Every ``csrc/**/*.cu`` (kernels, C entry points) and ``csrc/host/*.cpp`` (the torch ops) is compiled in its own
nvcc process, in parallel, with one line of progress per file, then linked into one shared library with the CUDA
runtime linked statically. Each source is compiled for the build targets of its kernel family
(``omni_hf/kernels/table.py``'s ``BUILD_TARGETS``: SASS for the GPUs named and PTX that later GPUs JIT), by
default all of them: every GPU from compute capability 8.0 on runs the library. The ops use torch's stable C ABI
only (``-DTORCH_TARGET_VERSION``), so the library runs with every torch from `TORCH_TARGET` onward, whichever
torch's headers built it.

Needs: nvcc; CuTe/CUTLASS headers from ``$CUTLASS_PATH/include`` or the ``nvidia-cutlass`` wheel
(``cutlass_library/source/include``); torch's headers from the installed torch, or from the torch package folder
``$OMNI_HF_TORCH_DIR`` (e.g. an older torch unpacked from its wheel). No GPU and no torch import are needed.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

LIB_NAME = "libomni_hf_cuda.so"
CSRC = Path(__file__).resolve().parent.parent / "csrc"
# Sources include each other by their path under csrc/ ("host/status.cuh") and the C ABI by its name
# ("omni_attention.h", in csrc/include/, as a program using the ABI would).
INCLUDE_DIRS = (CSRC, CSRC / "include")
TORCH_TARGET = (2, 10)  # oldest torch whose stable ABI the ops use
NVCC_FLAGS = ("-O3", "-std=c++17", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC")
# The torch libraries whose stable-ABI symbols the ops call: recorded as needed (resolved at load time against the
# torch already imported), linked against empty stand-ins so that building needs no torch binaries.
TORCH_LIBRARIES = ("torch_cpu", "torch_cuda")


class BuildError(RuntimeError):
    """The library could not be built (missing tool or headers, or a failed compile)."""


def _load_table():
    """omni_hf/kernels/table.py, read by its path: the build runs without torch (setup.py) and so without importing
    the package."""
    spec = importlib.util.spec_from_file_location("omni_hf_kernel_table",
                                                  Path(__file__).resolve().parent / "kernels" / "table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BUILD_TARGETS = _load_table().BUILD_TARGETS
# Every target of every family, in the table's order: what a wheel and an editable install carry.
DEFAULT_ARCHS = tuple(dict.fromkeys(t for targets in BUILD_TARGETS.values() for t in targets))


def find_nvcc() -> str | None:
    """Path of nvcc from $CUDA_HOME / $CUDA_PATH, else PATH; None when absent."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    return shutil.which("nvcc")


def find_cutlass_include() -> Path:
    """The CUTLASS include directory (holds ``cute/tensor.hpp``); raises BuildError when not found."""
    candidates = []
    if os.environ.get("CUTLASS_PATH"):
        candidates.append(Path(os.environ["CUTLASS_PATH"]) / "include")
    spec = importlib.util.find_spec("cutlass_library")  # the nvidia-cutlass wheel
    if spec is not None and spec.origin:
        candidates.append(Path(spec.origin).parent / "source" / "include")
    for path in candidates:
        if (path / "cute" / "tensor.hpp").is_file():
            return path
    raise BuildError(
        "CUTLASS headers not found: `python3 -m pip install --no-deps nvidia-cutlass` or set CUTLASS_PATH to a "
        f"CUTLASS checkout (looked in: {', '.join(map(str, candidates)) or 'nothing'})"
    )


def find_torch_include() -> Path:
    """torch's C++ include directory (holds ``torch/csrc/stable/library.h``); raises BuildError when not found."""
    if os.environ.get("OMNI_HF_TORCH_DIR"):
        root = Path(os.environ["OMNI_HF_TORCH_DIR"])
    else:
        spec = importlib.util.find_spec("torch")
        root = Path(spec.origin).parent if spec is not None and spec.origin else None
    include = None if root is None else root / "include"
    if include is None or not (include / "torch" / "csrc" / "stable" / "library.h").is_file():
        raise BuildError(f"torch's stable-ABI headers not found (looked in {include}); install torch >= "
                         f"{TORCH_TARGET[0]}.{TORCH_TARGET[1]} or set OMNI_HF_TORCH_DIR to a torch package folder")
    return include


def sources(only: str | None = None) -> list[Path]:
    """The .cu and host .cpp files under csrc/ (all, or those whose relative path matches the glob `only`)."""
    files = sorted([*CSRC.rglob("*.cu"), *(CSRC / "host").glob("*.cpp")])
    if only:
        files = [f for f in files if fnmatch.fnmatch(str(f.relative_to(CSRC)), only)]
    return files


def normalized_archs(archs: tuple[str, ...]) -> tuple[str, ...]:
    """Build targets as the table names them: SASS "sm_XY" (also given as "XY") or PTX "compute_XY"; raises
    BuildError for anything else."""
    names = tuple(a if a.startswith(("sm_", "compute_")) else f"sm_{a}" for a in archs)
    bad = [a for a in names if not a.split("_", 1)[1].rstrip("a").isdigit()]
    if bad or not names:
        raise BuildError(f"archs: expected targets such as sm_80, 90a or compute_80, got {', '.join(archs) or 'none'}")
    return names


def source_targets(src: Path, archs: tuple[str, ...]) -> tuple[str, ...]:
    """The targets of ``archs`` that a source is compiled for: those of its kernel family (sm90/ holds the sm90
    family, every other source is portable). A source none of whose targets is chosen still compiles, for the chosen
    ones, so that the library links: its kernels are then stubs that the dispatch never launches (the sm_90a kernels
    run on compute capability 9.0 only)."""
    family = "sm90" if src.relative_to(CSRC).parts[0] == "sm90" else "sm80"
    return tuple(t for t in archs if t in BUILD_TARGETS[family]) or archs


def gencode_flags(targets: tuple[str, ...]) -> list[str]:
    """-gencode flags: SASS for "sm_XY" (runs on GPUs of that major version from that minor on; "a" targets on that
    GPU only), PTX for "compute_XY" (compiled by the driver for any later GPU)."""
    return [f"-gencode=arch=compute_{t.split('_', 1)[1]},code={t}" for t in targets]


def torch_flags() -> list[str]:
    """Flags of the host sources: torch's headers, its stable ABI pinned to `TORCH_TARGET`, its CUDA shim."""
    major, minor = TORCH_TARGET
    return [f"-I{find_torch_include()}", f"-DTORCH_TARGET_VERSION=0x{major:02x}{minor:02x}000000000000", "-DUSE_CUDA"]


def source_hash(archs: tuple[str, ...]) -> str:
    """A digest of every csrc file and the flags: names the cache directory of a build."""
    digest = hashlib.sha256()
    for path in sorted(p for p in CSRC.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(CSRC)).encode())
        digest.update(path.read_bytes())
    digest.update(" ".join(NVCC_FLAGS + normalized_archs(archs) + TORCH_LIBRARIES).encode())
    digest.update(repr(TORCH_TARGET).encode())
    return digest.hexdigest()[:16]


def _compile(nvcc: str, src: Path, obj: Path, flags: list[str]) -> tuple[Path, float, str]:
    start = time.monotonic()
    cmd = [nvcc, *flags, "-c", str(src), "-o", str(obj)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"nvcc failed on {src.relative_to(CSRC)}:\n{' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
    return src, time.monotonic() - start, proc.stderr


def compile_objects(
    obj_dir: Path, archs: tuple[str, ...] = DEFAULT_ARCHS, jobs: int | None = None, only: str | None = None,
    extra_flags: tuple[str, ...] = (), log=sys.stderr,
) -> list[Path]:
    """Compiles the selected sources into obj_dir, one nvcc process each, `jobs` at a time."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise BuildError("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    srcs = sources(only)
    if not srcs:
        raise BuildError(f"no sources under {CSRC} match {only!r}")
    archs = normalized_archs(archs)
    flags = [*NVCC_FLAGS, *(f"-I{d}" for d in INCLUDE_DIRS), f"-I{find_cutlass_include()}", *extra_flags]
    host_flags = torch_flags() if any(s.suffix == ".cpp" for s in srcs) else []
    obj_dir = Path(obj_dir)
    obj_dir.mkdir(parents=True, exist_ok=True)
    objs = [obj_dir / (str(s.relative_to(CSRC)).replace(os.sep, "__") + ".o") for s in srcs]
    jobs = jobs or os.cpu_count() or 1
    print(f"omni_hf: compiling {len(srcs)} CUDA sources for {', '.join(archs)} with {jobs} jobs "
          f"(about {_estimate_minutes(srcs, archs, jobs)} min)", file=log)
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(_compile, nvcc, s, o, [*flags, *gencode_flags(source_targets(s, archs)),
                                                      *(host_flags if s.suffix == ".cpp" else [])])
                   for s, o in zip(srcs, objs)]
        for i, fut in enumerate(futures, 1):
            src, seconds, messages = fut.result()
            print(f"  [{i}/{len(srcs)}] {src.relative_to(CSRC)} ({seconds:.0f}s, {time.monotonic() - start:.0f}s "
                  "elapsed)", file=log)
            if messages.strip():
                print(messages.rstrip(), file=log)
    return objs


def _estimate_minutes(srcs: list[Path], archs: tuple[str, ...], jobs: int) -> int:
    """A rough build time: a kernel instantiation takes about a minute of one core per target it is compiled for."""
    target_minutes = sum(len(source_targets(s, archs)) for s in srcs)
    return max(1, round(target_minutes / min(jobs, len(srcs))))


def _torch_stubs(directory: Path) -> None:
    """Empty libtorch_cpu.so / libtorch_cuda.so in `directory`, to link against: the library then records them as
    needed, and the loader resolves their symbols in the torch already imported."""
    stub = directory / "stub.c"
    stub.write_text("")
    for name in TORCH_LIBRARIES:
        path = directory / f"lib{name}.so"
        subprocess.run(["cc", "-shared", "-o", str(path), f"-Wl,-soname,lib{name}.so", str(stub)], check=True)


def link(objs: list[Path], lib_path: Path) -> Path:
    """Links the objects into a shared library with the CUDA runtime linked statically."""
    nvcc = find_nvcc()
    with tempfile.TemporaryDirectory() as stubs:
        _torch_stubs(Path(stubs))
        cmd = [nvcc, "-shared", "-cudart", "static", "-Xcompiler", "-fPIC", *map(str, objs),
               "-Xlinker", "--no-as-needed", f"-L{stubs}", *(f"-l{name}" for name in TORCH_LIBRARIES),
               "-o", str(lib_path)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"link failed:\n{' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
    return lib_path


def build(out_dir: Path, archs: tuple[str, ...] = DEFAULT_ARCHS, jobs: int | None = None,
          extra_flags: tuple[str, ...] = (), log=sys.stderr, only: str | None = None) -> Path:
    """Compiles every source (or those matching the glob `only`) in a temporary directory and links
    out_dir/libomni_hf_cuda.so (written atomically); returns its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    tmp = out_dir / f".{LIB_NAME}.{os.getpid()}"
    with tempfile.TemporaryDirectory() as obj_dir:
        objs = compile_objects(Path(obj_dir), archs, jobs, only, extra_flags=extra_flags, log=log)
        link(objs, tmp)
    lib = out_dir / LIB_NAME
    os.replace(tmp, lib)
    print(f"omni_hf: built {lib} in {time.monotonic() - start:.0f}s", file=log)
    return lib


def parse_archs(text: str) -> tuple[str, ...]:
    """Build targets from a comma-separated list ("sm_80,90a,compute_80")."""
    return tuple(a.strip() for a in text.split(",") if a.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m omni_hf.build", description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default=",".join(DEFAULT_ARCHS),
                        help="comma-separated build targets, e.g. sm_80,sm_90a,compute_80 (default: every target)")
    parser.add_argument("--jobs", type=int, default=None, help="parallel nvcc processes (default: all cores)")
    parser.add_argument("--only", default=None, help="compile only sources matching this glob into OUT/obj (no link)")
    parser.add_argument("--out", default=None, help="output directory (default: omni_hf/lib)")
    parser.add_argument("--ptxas-info", action="store_true", help="print registers and spills per kernel")
    args = parser.parse_args(argv)
    archs = parse_archs(args.arch)
    out = Path(args.out) if args.out else Path(__file__).resolve().parent / "lib"
    extra = ("-Xptxas", "-v") if args.ptxas_info else ()
    try:
        if args.only:
            compile_objects(out / "obj", archs, args.jobs, args.only, extra)
        else:
            build(out, archs, args.jobs, extra)
    except BuildError as err:
        print(f"omni_hf: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
