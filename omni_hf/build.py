"""Build the omni_hf CUDA library (``libomni_hf_cuda.so``) with nvcc.

    python -m omni_hf.build [--arch 80,90a] [--jobs N] [--only PATTERN] [--out DIR]

Every ``csrc/**/*.cu`` is compiled in its own nvcc process (in parallel, one line of progress per file),
then linked into one shared library with the CUDA runtime linked statically, so the library depends on
nothing but the driver. CuTe/CUTLASS headers come from ``$CUTLASS_PATH/include`` or the ``nvidia-cutlass``
wheel (``cutlass_library/source/include``).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

LIB_NAME = "libomni_hf_cuda.so"
CSRC = Path(__file__).resolve().parent.parent / "csrc"
DEFAULT_ARCHS = ("80", "90a")
NVCC_FLAGS = ("-O3", "-std=c++17", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC")


class BuildError(RuntimeError):
    """The library could not be built (missing tool or headers, or a failed compile)."""


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
    try:
        import cutlass_library  # the nvidia-cutlass wheel

        candidates.append(Path(cutlass_library.__file__).resolve().parent / "source" / "include")
    except ImportError:
        pass
    for path in candidates:
        if (path / "cute" / "tensor.hpp").is_file():
            return path
    raise BuildError(
        "CUTLASS headers not found: `pip install --no-deps nvidia-cutlass` or set CUTLASS_PATH to a CUTLASS "
        f"checkout (looked in: {', '.join(map(str, candidates)) or 'nothing'})"
    )


def sources(only: str | None = None) -> list[Path]:
    """The .cu files under csrc/ (all of them, or those whose relative path matches the glob `only`)."""
    files = sorted(CSRC.rglob("*.cu"))
    if only:
        files = [f for f in files if fnmatch.fnmatch(str(f.relative_to(CSRC)), only)]
    return files


def gencode_flags(archs: tuple[str, ...]) -> list[str]:
    """-gencode flags building real machine code for each arch (e.g. "80" -> sm_80, "90a" -> sm_90a)."""
    return [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]


def source_hash(archs: tuple[str, ...]) -> str:
    """A digest of every csrc file and the flags: names the cache directory of a build."""
    digest = hashlib.sha256()
    for path in sorted(p for p in CSRC.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(CSRC)).encode())
        digest.update(path.read_bytes())
    digest.update(" ".join(NVCC_FLAGS + tuple(archs)).encode())
    return digest.hexdigest()[:16]


def _compile(nvcc: str, src: Path, obj: Path, flags: list[str]) -> tuple[Path, float, str]:
    start = time.monotonic()
    cmd = [nvcc, *flags, "-c", str(src), "-o", str(obj)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"nvcc failed on {src.relative_to(CSRC)}:\n{' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
    return src, time.monotonic() - start, proc.stderr


def compile_objects(
    out_dir: Path, archs: tuple[str, ...] = DEFAULT_ARCHS, jobs: int | None = None, only: str | None = None,
    extra_flags: tuple[str, ...] = (), log=sys.stderr,
) -> list[Path]:
    """Compiles the selected sources into out_dir/obj/, one nvcc process each, `jobs` at a time."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise BuildError("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    srcs = sources(only)
    if not srcs:
        raise BuildError(f"no .cu sources under {CSRC} match {only!r}")
    flags = [*NVCC_FLAGS, *gencode_flags(archs), f"-I{CSRC}", f"-I{find_cutlass_include()}", *extra_flags]
    obj_dir = out_dir / "obj"
    obj_dir.mkdir(parents=True, exist_ok=True)
    objs = [obj_dir / (str(s.relative_to(CSRC)).replace(os.sep, "__") + ".o") for s in srcs]
    jobs = jobs or os.cpu_count() or 1
    print(f"omni_hf: compiling {len(srcs)} CUDA sources for sm_{', sm_'.join(archs)} with {jobs} jobs", file=log)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(_compile, nvcc, s, o, flags) for s, o in zip(srcs, objs)]
        for i, fut in enumerate(futures, 1):
            src, seconds, messages = fut.result()
            print(f"  [{i}/{len(srcs)}] {src.relative_to(CSRC)} ({seconds:.0f}s)", file=log)
            if messages.strip():
                print(messages.rstrip(), file=log)
    return objs


def link(objs: list[Path], lib_path: Path, archs: tuple[str, ...] = DEFAULT_ARCHS) -> Path:
    """Links the objects into a shared library with the CUDA runtime linked statically."""
    nvcc = find_nvcc()
    cmd = [nvcc, "-shared", "-cudart", "static", *gencode_flags(archs), "-Xcompiler", "-fPIC",
           *map(str, objs), "-o", str(lib_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"link failed:\n{' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
    return lib_path


def build(out_dir: Path, archs: tuple[str, ...] = DEFAULT_ARCHS, jobs: int | None = None,
          extra_flags: tuple[str, ...] = (), log=sys.stderr) -> Path:
    """Compiles every source and links out_dir/libomni_hf_cuda.so (written atomically); returns its path."""
    out_dir = Path(out_dir)
    start = time.monotonic()
    objs = compile_objects(out_dir, archs, jobs, extra_flags=extra_flags, log=log)
    tmp = out_dir / f".{LIB_NAME}.{os.getpid()}"
    link(objs, tmp, archs)
    lib = out_dir / LIB_NAME
    os.replace(tmp, lib)
    print(f"omni_hf: built {lib} in {time.monotonic() - start:.0f}s", file=log)
    return lib


def _parse_archs(text: str) -> tuple[str, ...]:
    return tuple(a.strip() for a in text.split(",") if a.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m omni_hf.build", description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default=",".join(DEFAULT_ARCHS), help="comma-separated, e.g. 80,90a")
    parser.add_argument("--jobs", type=int, default=None, help="parallel nvcc processes (default: all cores)")
    parser.add_argument("--only", default=None, help="compile only sources matching this glob (no link)")
    parser.add_argument("--out", default=None, help="output directory (default: omni_hf/lib)")
    parser.add_argument("--ptxas-info", action="store_true", help="print registers and spills per kernel")
    args = parser.parse_args(argv)
    archs = _parse_archs(args.arch)
    out = Path(args.out) if args.out else Path(__file__).resolve().parent / "lib"
    extra = ("-Xptxas", "-v") if args.ptxas_info else ()
    try:
        if args.only:
            compile_objects(out, archs, args.jobs, args.only, extra)
        else:
            build(out, archs, args.jobs, extra)
    except BuildError as err:
        print(f"omni_hf: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
