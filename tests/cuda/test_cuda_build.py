"""CPU-only checks of the CUDA library's sources and build (skipped where nvcc or the CUTLASS / torch headers are
absent): the ABI version and the values Python shares with the library, the torch ops compiled against torch's
stable ABI at the target version, a library linked so that it needs torch's libraries, one kernel instantiation for
sm_80, the implicit-mask block rule and the token rule of csrc/common/mask_rule.cuh run on the host against their
definitions, and the generated instantiations and shared values (csrc/generate_instantiations.py) and head-dim
dispatch."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from omni_hf import OmniBlockMask, build
from omni_hf.kernels import loader, table
from tests.helpers.brute_force import causal_dense, random_token_ids, token_rule_dense


def needs(*tools: str) -> None:
    """Skip unless the build tools are here."""
    if build.find_nvcc() is None:
        pytest.skip("nvcc not found")
    try:
        for tool in tools:
            {"cutlass": build.find_cutlass_include, "torch": build.find_torch_include}[tool]()
    except build.BuildError as err:
        pytest.skip(str(err))


def host_program(source: str, exe: Path) -> Path:
    """``source`` (CUDA C++ that includes csrc's headers) compiled by nvcc into the host program ``exe``."""
    exe.with_suffix(".cu").write_text(source)
    includes = [f"-I{d}" for d in build.INCLUDE_DIRS]
    subprocess.run([build.find_nvcc(), "-std=c++17", *includes, str(exe.with_suffix(".cu")), "-o", str(exe)],
                   check=True)
    return exe


def test_python_expects_the_abi_version_of_the_header():
    header = (build.CSRC / "include" / "omni_attention.h").read_text()
    assert f"#define OMNI_ABI_VERSION {loader.ABI_VERSION}\n" in header


def load_generator():
    """csrc/generate_instantiations.py as a module (csrc/ is no package)."""
    spec = importlib.util.spec_from_file_location("generate_instantiations",
                                                  build.CSRC / "generate_instantiations.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_instantiations_are_what_the_generator_writes():
    generator = load_generator()
    assert generator.differences() == []
    committed = {p.relative_to(build.CSRC) for arch in generator.ARCHS for p in (build.CSRC / arch / "inst").iterdir()}
    assert committed == {p for p in generator.generated_files() if p.parts[1] == "inst"}


def test_python_reads_the_values_of_the_table():
    generator = load_generator()
    assert table.HEAD_DIMS == tuple(sorted(generator.HEAD_DIMS))
    assert (table.BLOCK_SIZES, table.MAX_GRID_YZ) == (generator.BLOCK_SIZES, generator.MAX_GRID_YZ)
    assert table.BUILD_TARGETS == generator.BUILD_TARGETS and table.SM80_SMEM_BYTES == generator.SM80_SMEM_BYTES
    assert table.SM90_CAPABILITY == (9, 0) and table.MIN_CAPABILITY == (8, 0)


@pytest.mark.parametrize("families", [("sm80", "sm90", "decode"), ("sm80",), ("sm80", "sm90:fwd")])
def test_a_head_dim_added_to_the_table_reaches_its_instantiations_and_the_dispatch(monkeypatch, families):
    generator = load_generator()
    monkeypatch.setattr(generator, "HEAD_DIMS", {**generator.HEAD_DIMS, 96: families})
    files = generator.generated_files()
    for arch in generator.ARCHS:
        for direction in generator.DIRECTIONS:
            for dtype, element in generator.DTYPES.items():
                path = Path(arch, "inst", f"{direction}_{dtype}_hdim96.cu")
                wanted = arch in families or f"{arch}:{direction}" in families
                assert (path in files) == wanted, path
                if wanted:
                    text = files[path]
                    assert f"run_{direction}<{element}, 96>" in text and f'"{arch}/{direction}_launch.cuh"' in text
    header = files[Path("host", "table.h")]
    dims = sorted(generator.HEAD_DIMS)
    assert f"#define OMNI_FOR_EACH_HEAD_DIM(X) {' '.join(f'X({d})' for d in dims)}\n" in header
    for macro, family, direction in (("SM90_FWD", "sm90", "fwd"), ("SM90_BWD", "sm90", "bwd"),
                                      ("DECODE", "decode", None)):
        taken = [d for d in dims if generator.takes(d, family, direction)]
        assert f"#define OMNI_FOR_EACH_{macro}_HEAD_DIM(X) {' '.join(f'X({d})' for d in taken)}\n" in header
        assert (96 in taken) == (family in families or f"{family}:{direction}" in families)
    assert f'"{", ".join(map(str, dims[:-1]))} and {dims[-1]}"' in header


DISPATCH_HARNESS = r"""
#include <cstdio>
#include "host/dispatch.cuh"
// Prints, for every head dim up to 512, the kernel head dim that runs it, what the dispatch calls, and whether the
// sm_90a and decode kernels are instantiated for it (as a kernel head dim).
int main() {
  for (int d = 0; d <= 512; ++d) {
    const int called = omni::dispatch_head_dim(d, [](auto head_dim) { return int(head_dim()); }, [] { return -1; });
    std::printf("%d %d %d %d %d %d\n", d, omni::kernel_head_dim(d), called, int(omni::sm90_fwd_head_dim(d)),
                int(omni::sm90_bwd_head_dim(d)), int(omni::decode_head_dim(d)));
  }
  return 0;
}
"""


def test_head_dim_dispatch_rounds_up_to_the_tables_head_dims(tmp_path):
    """host/dispatch.cuh, compiled on the host from the committed X-macros: every positive multiple of 8 up to the
    table's largest head dim runs on the smallest table head dim at or above it (the dispatch calls that one), every
    other head dim falls through; the sm_90a and decode checks of a kernel head dim follow the table's families."""
    needs()
    exe = host_program(DISPATCH_HARNESS, tmp_path / "dispatch")
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    generator = load_generator()
    table = sorted(generator.HEAD_DIMS)
    for line in out.splitlines():
        d, kernel, called, sm90_fwd, sm90_bwd, decode = map(int, line.split())
        expected = next((t for t in table if t >= d), 0) if d > 0 and d % 8 == 0 else 0
        assert kernel == expected, d
        assert called == (expected or -1), d
        assert bool(sm90_fwd) == generator.takes(d, "sm90", "fwd"), d
        assert bool(sm90_bwd) == generator.takes(d, "sm90", "bwd"), d
        assert bool(decode) == generator.takes(d, "decode"), d


def test_the_build_command_runs_without_warnings():
    """``python -m omni_hf.build`` imports the package first; the package must not have imported the build module by
    then, or runpy runs it a second time and warns."""
    done = subprocess.run([sys.executable, "-W", "error", "-m", "omni_hf.build", "--help"], capture_output=True,
                          text=True, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "usage: python -m omni_hf.build" in done.stdout


def test_source_hash_changes_with_the_target_arch():
    assert build.source_hash(("80",)) != build.source_hash(("90a",))


def test_ops_link_into_a_library_that_needs_torchs_libraries(tmp_path):
    """The torch ops compile against the stable ABI pinned to the target version and link against stand-ins,
    so the library records libtorch_cpu / libtorch_cuda as needed without a CUDA torch at build time."""
    needs("cutlass", "torch")
    objs = build.compile_objects(tmp_path, archs=("80",), jobs=2, only="host/*.cpp")
    objs += build.compile_objects(tmp_path, archs=("80",), jobs=2, only="host/status.cu")
    lib = build.link(objs, tmp_path / "lib.so")
    dynamic = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    for name in build.TORCH_LIBRARIES:
        assert f"[lib{name}.so]" in dynamic
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    assert "omni_set_poison_outputs" in symbols and "omni_abi_version" in symbols


def test_one_forward_instantiation_compiles_for_sm80(tmp_path):
    needs("cutlass")
    [obj] = build.compile_objects(tmp_path, archs=("80",), jobs=2, only="sm80/inst/fwd_bf16_hdim128.cu")
    assert obj.stat().st_size > 0


HARNESS = r"""
#include <cstdio>
#include "common/mask_rule.cuh"
// Prints, for an implicit mask, every listed (row, column, type) of the row view and of the column view.
int main(int argc, char** argv) {
  int q_len, kv_len, block_q, block_kv, window, kind;
  while (std::scanf("%d %d %d %d %d %d", &q_len, &kv_len, &block_q, &block_kv, &window, &kind) == 6) {
    OmniMask m{};
    m.kind = kind; m.block_q = block_q; m.block_kv = block_kv; m.window = window;
    const int num_q = (q_len + block_q - 1) / block_q, num_kv = (kv_len + block_kv - 1) / block_kv;
    for (int qb = 0; qb < num_q; ++qb) {
      const int qpos = qb * block_q + kv_len - q_len;
      const omni::BlockSpan s = omni::implicit_row_span(m, qpos, kv_len);
      for (int kb = s.first; kb < s.first + s.count; ++kb)
        std::printf("r %d %d %d\n", qb, kb,
                    omni::implicit_block_type(m, qpos, omni::implicit_last_qpos(m, qpos, kv_len), kb, kv_len));
    }
    for (int kb = 0; kb < num_kv; ++kb) {
      const omni::BlockSpan s = omni::implicit_column_span(m, kb, q_len, kv_len);
      for (int qb = s.first; qb < s.first + s.count; ++qb) {
        const int qpos = qb * block_q + kv_len - q_len;
        std::printf("c %d %d %d\n", qb, kb,
                    omni::implicit_block_type(m, qpos, omni::implicit_last_qpos(m, qpos, kv_len), kb, kv_len));
      }
    }
    std::printf("end\n");
  }
  return 0;
}
"""

IMPLICIT_CASES = [(q, kv, bq, bk, w, kind)
                  for q, kv in [(1, 1), (1, 300), (63, 700), (129, 129), (300, 300), (700, 300), (257, 1031)]
                  for bq, bk in [(64, 64), (128, 128), (64, 128), (128, 64)]
                  for w, kind in [(0, 1), (1, 1), (50, 1), (200, 1), (0, 2)]]


def implicit_case_outputs(harness: str, exe: Path) -> list[tuple[tuple[int, ...], str]]:
    """Each of IMPLICIT_CASES with what the host program ``harness`` (compiled into ``exe``) printed for it, the
    cases read one per line from its stdin and each answer ended by a line "end"."""
    lines = "".join(" ".join(map(str, case)) + "\n" for case in IMPLICIT_CASES)
    out = subprocess.run([str(host_program(harness, exe))], input=lines, capture_output=True, text=True,
                         check=True).stdout
    return list(zip(IMPLICIT_CASES, out.split("end\n")))


def test_implicit_blocks_of_the_kernels_cover_exactly_the_allowed_pairs(tmp_path):
    """The row and column views the kernels derive for implicit masks, run on the host: every pair the rule
    allows lies in a listed block, each block's type holds for every pair in it, and both views list the same
    blocks as `OmniBlockMask.block_table` (what the reference and `describe` use)."""
    needs()
    for case, block in implicit_case_outputs(HARNESS, tmp_path / "harness"):
        q_len, kv_len, block_q, block_kv, window, kind = case
        mask = (OmniBlockMask.causal(q_len, kv_len, block_size=(block_q, block_kv), window=window or None)
                if kind == 1 else OmniBlockMask.full(q_len, kv_len, block_size=(block_q, block_kv)))
        views = {"r": {}, "c": {}}
        for entry in filter(None, block.split("\n")):
            view, qb, kb, kind_ = entry.split()
            views[view][int(qb), int(kb)] = int(kind_)
        assert views["r"] == views["c"], case
        table, _ = mask.block_table()
        listed = {(qb, kb): int(t) for (qb, kb), t in zip(torch.nonzero(table[0, 0]).tolist(),
                                                           table[0, 0][table[0, 0] != 0].tolist())}
        assert views["r"] == listed, case
        dense = mask.to_dense()[0, 0]
        if kind == 1:
            qpos = torch.arange(q_len)[:, None] + kv_len - q_len
            expected = causal_dense(q_len, kv_len) & ((qpos - torch.arange(kv_len)[None]) < (window or kv_len + 1))
            assert torch.equal(dense, expected), case
        covered = torch.zeros(q_len, kv_len, dtype=torch.bool)
        for (qb, kb), t in views["r"].items():
            rows, cols = slice(qb * block_q, (qb + 1) * block_q), slice(kb * block_kv, (kb + 1) * block_kv)
            covered[rows, cols] = True
            tile = dense[rows, cols]
            if t == 1:
                assert tile.all(), (case, qb, kb)
            elif t == 2:
                assert torch.equal(tile, causal_dense(q_len, kv_len)[rows, cols]), (case, qb, kb)
        assert not (dense & ~covered).any(), case


TURN_HARNESS = r"""
#include <cstdio>
#include "common/bwd_turns.cuh"
// Prints, for an implicit mask, every block (qb, kb) of the column view with the deterministic backward's count of
// the earlier key blocks that reach qb: counted whole, and as the sum of 32 lanes' shares.
int main() {
  int q_len, kv_len, block_q, block_kv, window, kind;
  while (std::scanf("%d %d %d %d %d %d", &q_len, &kv_len, &block_q, &block_kv, &window, &kind) == 6) {
    OmniMask m{};
    m.kind = kind; m.block_q = block_q; m.block_kv = block_kv; m.window = window;
    for (int kb = 0; kb < (kv_len + block_kv - 1) / block_kv; ++kb) {
      const omni::BlockSpan s = omni::implicit_column_span(m, kb, q_len, kv_len);
      for (int qb = s.first; qb < s.first + s.count; ++qb) {
        const int qpos = qb * block_q + kv_len - q_len;
        if (omni::implicit_block_type(m, qpos, omni::implicit_last_qpos(m, qpos, kv_len), kb, kv_len) == 0) continue;
        int lanes = 0;
        for (int lane = 0; lane < 32; ++lane)
          lanes += omni::bwd::implicit_blocks_before(m, qb, kb, q_len, kv_len, lane, 32);
        const int whole = omni::bwd::implicit_blocks_before(m, qb, kb, q_len, kv_len, 0, 1);
        std::printf("%d %d %d %d\n", qb, kb, whole, lanes);
      }
    }
    std::printf("end\n");
  }
  return 0;
}
"""


def test_the_deterministic_turn_counts_the_earlier_key_blocks_that_reach_a_q_block(tmp_path):
    """The deterministic backward's turn under an implicit mask (csrc/common/bwd_turns.cuh), run on the host: for
    every block the column walk visits, the count of earlier key blocks reaching its Q block is the number of key
    blocks before it that hold an allowed pair of those rows (from the dense mask), whole and summed over 32 lanes'
    shares. A count too high would leave a CTA waiting for a turn that never comes; too low, two CTAs would add at
    once."""
    needs()
    for case, block in implicit_case_outputs(TURN_HARNESS, tmp_path / "turns"):
        q_len, kv_len, block_q, block_kv, window, kind = case
        dense = (causal_dense(q_len, kv_len, window or None) if kind == 1
                 else torch.ones(q_len, kv_len, dtype=torch.bool))
        num_q, num_kv = -(-q_len // block_q), -(-kv_len // block_kv)
        padded = torch.zeros(num_q * block_q, num_kv * block_kv, dtype=torch.bool)
        padded[:q_len, :kv_len] = dense
        reaches = padded.view(num_q, block_q, num_kv, block_kv).any(dim=3).any(dim=1)  # [num_q, num_kv]
        counts = {}
        for entry in filter(None, block.split("\n")):
            qb, kb, whole, lanes = map(int, entry.split())
            counts[qb, kb] = (whole, lanes)
        assert set(counts) == {tuple(ij) for ij in torch.nonzero(reaches).tolist()}, case
        for (qb, kb), (whole, lanes) in counts.items():
            expected = int(reaches[qb, :kb].sum())
            assert whole == lanes == expected, (case, qb, kb, whole, lanes, expected)


TOKEN_HARNESS = r"""
#include <cstdio>
#include <vector>
#include "common/mask_rule.cuh"
// Per case "kv_len q_len window covers_groups", the doc ids, the group ids: prints the rule's rows, one 0/1 per key.
int main() {
  int kv_len, q_len, window, covers;
  while (std::scanf("%d %d %d %d", &kv_len, &q_len, &window, &covers) == 4) {
    std::vector<int> doc(kv_len), grp(kv_len);
    for (int& id : doc) std::scanf("%d", &id);
    for (int& id : grp) std::scanf("%d", &id);
    for (int i = 0; i < q_len; ++i) {
      const int qpos = i + kv_len - q_len;
      for (int j = 0; j < kv_len; ++j)
        std::putchar('0' + omni::token_allowed(doc[qpos], grp[qpos], doc[j], grp[j], qpos, j, window, covers != 0));
      std::putchar('\n');
    }
  }
  return 0;
}
"""


def test_token_rule_of_the_kernels_is_its_definition_for_both_window_scopes(tmp_path):
    """`token_allowed` (csrc/common/mask_rule.cuh, what every kernel evaluates on token-rule tiles), run on the host
    over random ids with padding, packed documents and groups longer and shorter than the window, q_len < kv_len:
    equal to the brute-force token rule with the window over the causal part and with the window over groups too."""
    needs()
    exe = host_program(TOKEN_HARNESS, tmp_path / "token_harness")
    cases, lines = [], []
    for seed, (kv_len, q_len, window) in enumerate([(150, 150, 7), (150, 61, 40), (97, 97, 0), (200, 1, 90),
                                                    (130, 33, 1), (300, 300, 250)]):
        doc, grp = random_token_ids(1, kv_len, seed)
        for covers in (0, 1):
            cases.append((doc, grp, q_len, window, covers))
            lines += [f"{kv_len} {q_len} {window} {covers}", " ".join(map(str, doc[0].tolist())),
                      " ".join(map(str, grp[0].tolist()))]
    out = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True).stdout
    rows, expected_by_scope = iter(out.split()), {0: [], 1: []}
    for doc, grp, q_len, window, covers in cases:
        got = torch.tensor([[c == "1" for c in next(rows)] for _ in range(q_len)])
        expected = token_rule_dense(doc, grp, q_len, window or None, bool(covers))[0, 0]
        assert torch.equal(got, expected), (doc.shape[1], q_len, window, covers)
        expected_by_scope[covers].append(expected)
    assert next(rows, None) is None
    assert sum(not torch.equal(*pair) for pair in zip(*expected_by_scope.values())) >= 3, "the scopes should differ"
