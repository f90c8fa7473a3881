"""The benchmark suite's own logic on the CPU: masks against their definitions, the peers' masks against
omni's, the eager peer against the reference, checks, and the JSON / table / plot round trip.
GPU parts (a whole case through `benchmarks.run`) skip without CUDA and the omni_hf CUDA library."""

import json
import math
import random
import statistics
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks import layouts, measure, peers, report, run
from omni_hf.ops import reference
from tests.helpers.brute_force import causal_dense, token_rule_dense


def fresh_seed() -> int:
    return random.randrange(2**31)


def runs(ids: np.ndarray) -> list[tuple[int, int, int]]:
    """(id, start, end) of every run of equal ids, in a plain loop."""
    out, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[start]:
            out.append((int(ids[start]), start, i))
            start = i
    return out


def block_table_dense(table: layouts.BlockTable, seq_len: int) -> torch.Tensor:
    """bool [S, S] filled block by block from the table, in Python (the random layout's definition)."""
    dense = torch.zeros(seq_len, seq_len, dtype=torch.bool)
    s = table.size
    triangle = torch.ones(s, s).tril().bool()
    for qb in range(seq_len // s):
        for kb in range(seq_len // s):
            kind = int(table.types[qb, kb])
            tile = {1: torch.ones(s, s, dtype=torch.bool), 2: triangle, 0: torch.zeros(s, s, dtype=torch.bool),
                    3: torch.from_numpy(table.pool[max(int(table.pattern[qb, kb]), 0)])}[kind]
            dense[qb * s:(qb + 1) * s, kb * s:(kb + 1) * s] = tile
    return dense


def definition_dense(layout: layouts.Layout) -> torch.Tensor:
    """bool [S, S] of the layout from the definitions in tests/helpers/brute_force.py (or the block table)."""
    if layout.name == "causal":
        return causal_dense(layout.seq_len, layout.seq_len)
    if layout.name == "random_blocks":
        return block_table_dense(layout.blocks, layout.seq_len)
    doc, grp = (torch.from_numpy(x)[None] for x in (layout.doc, layout.grp))
    return token_rule_dense(doc, grp, layout.seq_len, layout.window)[0, 0]


def small_length(mask: str, rng: random.Random) -> int:
    if mask == "random_blocks":
        return 128 * rng.randint(2, 6)
    if mask == "vlm":
        return rng.randint(2100, 2600)  # more than one packed document
    return rng.randint(200, 900)


@pytest.mark.parametrize("mask", layouts.MASKS)
def test_layout_dense_mask_and_pair_count_match_the_definition(mask):
    rng = random.Random(fresh_seed())
    seq_len, seed = small_length(mask, rng), rng.randrange(2**31)
    layout = layouts.build(mask, seq_len, seed)
    want = definition_dense(layout)
    assert torch.equal(layout.dense(), want), f"{mask} S={seq_len} seed={seed}"
    assert layout.allowed_pairs() == int(want.sum()), f"{mask} S={seq_len} seed={seed}"


@pytest.mark.parametrize("mask", layouts.MASKS)
@pytest.mark.parametrize("block", [64, 128])
def test_omni_mask_equals_the_dense_mask_sdpa_receives_and_the_flex_mask(mask, block):
    from torch.nn.attention.flex_attention import create_block_mask

    rng = random.Random(fresh_seed())
    seq_len = 128 * rng.randint(2, 4) if mask in ("random_blocks", "vlm") else rng.randint(130, 500)
    layout = layouts.build(mask, seq_len, rng.randrange(2**31))
    dense = layout.dense()
    omni = layout.omni_mask(block)
    assert (omni.block_q, omni.block_kv) == (block, block)
    assert torch.equal(omni.to_dense()[0, 0], dense)
    flex = create_block_mask(layout.mask_mod(), None, None, seq_len, seq_len, device="cpu")
    q, kv = torch.arange(seq_len)[:, None], torch.arange(seq_len)[None, :]
    blocks = flex.to_dense()[0, 0].bool()  # Flex's partial and full blocks
    flex_q, flex_kv = flex.BLOCK_SIZE
    flex_dense = blocks[q // flex_q, kv // flex_kv] & layout.mask_mod()(0, 0, q, kv)
    assert torch.equal(flex_dense, dense)


def test_token_rule_pairs_counts_random_runs_with_a_window():
    rng = np.random.default_rng(fresh_seed())
    seq_len = int(rng.integers(50, 400))
    doc = np.repeat(np.arange(seq_len), rng.integers(1, 80, seq_len))[:seq_len].astype(np.int32)
    grp = np.full(seq_len, -1, np.int32)
    for index, (_, start, end) in enumerate(runs(doc)):
        a = int(rng.integers(start, end))
        grp[a:int(rng.integers(a + 1, end + 1))] = index
    window = int(rng.integers(1, 60))
    want = token_rule_dense(torch.from_numpy(doc)[None], torch.from_numpy(grp)[None], seq_len, window)
    assert layouts.token_rule_pairs(doc, grp, window) == int(want.sum())


def test_vlm_layout_packs_documents_of_text_and_576_token_images():
    seq_len = 3 * 8192
    doc, grp = layouts.vlm_ids(seq_len, seed=fresh_seed())
    documents = runs(doc)
    assert [d for d, _, _ in documents] == list(range(len(documents))) and len(documents) >= 4
    assert all(2048 <= end - start <= 6144 for _, start, end in documents[:-1])
    images = [r for r in runs(grp) if r[0] >= 0]
    assert [g for g, _, _ in images] == list(range(len(images)))
    for _, start, end in images:
        assert doc[start] == doc[end - 1], "an image crosses a document boundary"
        assert end - start == 576 or end == seq_len or doc[end] != doc[end - 1], "only a document's end cuts an image"
    assert len(images) >= 3 * len(documents)  # documents of 2k-6k hold several images each


def test_collator_packs_the_vlm_layout_back_into_its_ids():
    from omni_hf import OmniCollator

    seq_len = random.randint(5000, 9000)
    layout = layouts.build("vlm", seq_len, fresh_seed())
    batch = OmniCollator(0, mode="pack", max_length=seq_len)(layouts.collator_samples(layout))
    assert np.array_equal(batch["omni_doc_ids"][0].numpy(), layout.doc)
    assert np.array_equal(batch["omni_group_ids"][0].numpy(), layout.grp)


def test_random_block_layout_mixes_every_block_type_and_keeps_the_diagonal_causal():
    table = layouts.random_block_table(128 * 24, seed=fresh_seed())
    kinds = set(np.unique(table.types[np.tril_indices(24, -1)]).tolist())
    assert kinds == {0, 1, 3}  # MASKED, FULL, PARTIAL below the diagonal
    assert (np.diag(table.types) == 2).all() and not np.triu(table.types, 1).any()
    assert ((table.pattern >= 0) == (table.types == 3)).all()


def test_eager_peer_computes_masked_attention():
    torch.manual_seed(fresh_seed())
    layout = layouts.build("prefix_lm", 300, fresh_seed())
    dense = layout.dense()
    q, k, v = torch.randn(1, 4, 300, 32), torch.randn(1, 2, 300, 32), torch.randn(1, 2, 300, 32)
    want, _ = reference.attention_forward(q.double(), k.double(), v.double(), dense)
    got = peers.eager(32 ** -0.5, dense).fn(q, k, v)
    assert measure.rel_err(got, want) < 1e-5


def test_peer_list_follows_the_mask_and_the_omni_sm80_peer_runs_with_the_hopper_path_disabled(monkeypatch):
    from torch.nn.attention.flex_attention import create_block_mask

    monkeypatch.delenv("OMNI_HF_DISABLE_SM90", raising=False)
    seen = []
    monkeypatch.setattr(peers, "omni_attention", lambda q, k, v, mask, scale: seen.append(
        (mask.block_q, peers.os.environ.get("OMNI_HF_DISABLE_SM90"))) or q)
    for mask_name, sdpa_names in (("causal", ["sdpa-fa2", "sdpa-cudnn", "sdpa-eff"]),
                                  ("documents", ["sdpa-eff+mask", "sdpa-cudnn+mask"])):
        layout = layouts.build(mask_name, 256, fresh_seed())
        masks = [layout.omni_mask(64), layout.omni_mask(128)]
        flex = create_block_mask(layout.mask_mod(), None, None, 256, 256, device="cpu")
        listed = peers.for_case(masks, flex, layout.dense(), is_causal=layout.is_causal, heads_q=4, heads_kv=2,
                                scale=0.125, omni_sm80=True)
        assert [p.name for p in listed] == ["omni b64", "omni b128", "omni b128 sm80", "flex", *sdpa_names, "eager",
                                            "flex-flash"]
    q = torch.randn(1, 4, 256, 16)
    for peer in listed[:3]:
        with peer.running():
            peer.fn(q, q, q)
    assert seen == [(64, None), (128, None), (128, "1")]
    assert "OMNI_HF_DISABLE_SM90" not in peers.os.environ
    missing = {"dense": "dense not built: OutOfMemoryError", "flex": "flex not built: RuntimeError"}
    huge = peers.for_case(masks, None, None, is_causal=False, heads_q=4, heads_kv=2, scale=0.125,
                          why_missing=missing)
    assert {p.name: p.skipped for p in huge if p.skipped} == {
        "flex": missing["flex"], "flex-flash": missing["flex"],
        **{name: missing["dense"] for name in ("sdpa-eff+mask", "sdpa-cudnn+mask", "eager")}}


def test_flex_flash_peer_is_skipped_with_the_reason_it_cannot_run(monkeypatch):
    from torch.nn.attention.flex_attention import create_block_mask

    layout = layouts.build("vlm", 256, fresh_seed())
    flex = create_block_mask(layout.mask_mod(), None, None, 256, 256, device="cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    peer = peers.flex_flash(flex, 0.125, gqa=True)
    assert (peer.name, peer.fn, peer.skipped) == ("flex-flash", None, "no CUDA device")
    # With a GPU but no flash-attn-4: the import error is the reason (checked once per process, so cleared here)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)  # makes `import flash_attn.cute` raise
    peers._flash_import_error.cache_clear()
    try:
        peer = peers.flex_flash(flex, 0.125, gqa=True)
    finally:
        peers._flash_import_error.cache_clear()
    assert peer.fn is None and peer.skipped.startswith("flash_attn.cute not importable (ModuleNotFoundError: ")


def test_flex_flash_fails_its_check_when_no_cute_kernel_ran(monkeypatch):
    # A FLASH request that silently ran Flex's Triton kernels must not be timed as FLASH.
    from torch.nn.attention.flex_attention import create_block_mask

    flex = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, 256, 256, device="cpu")
    monkeypatch.setattr(peers, "flash_unavailable", lambda: None)
    q = torch.randn(1, 2, 256, 16)
    for kernels, ok in ((["triton_tem_fused_0", "triton_poi_fused_1"], False),
                        (["kernel_cutlass_kernel_flash_attncuteflash_fwd_sm90FlashAttentionForwardSm90_0"], True)):
        monkeypatch.setattr(peers, "_kernels_run_by", lambda call, kernels=kernels: (q, kernels))
        peer = peers.flex_flash(flex, 0.25, gqa=False)
        assert peer.errors_skip and peer.skipped is None
        if ok:
            assert peer.fn(q, q, q) is q
        else:
            with pytest.raises(measure.CheckFailed, match="ran no CuTe-DSL kernel"):
                peer.fn(q, q, q)


def _bare_case(backward: bool) -> run.Case:
    """A `run.Case` with small CPU inputs and references, none of its masks."""
    case = run.Case.__new__(run.Case)
    case.backward = backward
    case.q = torch.randn(1, 2, 8, 4)
    case.k = case.v = torch.randn(1, 2, 8, 4)
    case.dout = torch.randn(1, 2, 8, 4)
    case.want_fwd, case.want_fwd_bwd = (case.q,), None
    return case


def test_an_error_of_a_peer_marked_errors_skip_is_recorded_as_skipped_with_its_text():
    case = _bare_case(backward=False)

    def refuses(q, k, v):
        raise RuntimeError("BACKEND='FLASH' but flash attention cannot be used\n  target: flex_attention")

    (row,) = case.measure_peers([peers.Peer("flex-flash", refuses, errors_skip=True)])
    assert row["fwd"] == {"skipped": "cannot run: RuntimeError: BACKEND='FLASH' but flash attention cannot be used"
                                     " | target: flex_attention"}
    assert case.measure_peers([peers.Peer("other", refuses)])[0]["fwd"] == {
        "failed": "RuntimeError: BACKEND='FLASH' but flash attention cannot be used"}
    (wrong,) = case.measure_peers([peers.Peer("flex-flash", lambda q, k, v: q + 1, errors_skip=True)])
    assert wrong["fwd"]["failed"].startswith("check: out rel err")  # a wrong answer is a failure, never a skip


def test_rounds_time_every_peer_once_per_round_and_take_the_median_of_the_rounds(monkeypatch):
    case = _bare_case(backward=False)
    case.shape, case.pairs = run.Shape("t", 1, 2, 2, 4, torch.float32, (8,), (64,)), 36
    rounds, ran, timed = random.randint(3, 6), [], []
    drift = {name: [random.uniform(1, 2) for _ in range(rounds)] for name in "ab"}

    def peer(name):  # notes its name when it runs, so the fake timer knows whose run it times
        return peers.Peer(name, lambda q, k, v: ran.append(name) or q.clone())

    def fake_median_ms(run_fn, rep=100):
        run_fn()
        timed.append((ran[-1], rep))
        return drift[ran[-1]][sum(name == ran[-1] for name, _ in timed) - 1]

    monkeypatch.setattr(measure, "median_ms", fake_median_ms)
    monkeypatch.setattr(measure, "peak_mib", lambda run_fn: 0.0)
    rows = case.measure_peers([peer("a"), peer("b")], rounds=rounds)
    assert [name for name, _ in timed] == ["a", "b"] * rounds and {rep for _, rep in timed} == {100 / rounds}
    for row in rows:
        entry = row["fwd"]
        assert entry["round_ms"] == drift[row["peer"]] and entry["ms"] == statistics.median(drift[row["peer"]])
        assert entry["tflops"] == pytest.approx(4.0 * 4 * 2 * 36 / entry["ms"] * 1e-9)


def test_sustained_rounds_time_every_peer_by_seconds_back_to_back_instead_of_do_bench(monkeypatch):
    case = _bare_case(backward=False)
    case.shape, case.pairs = run.Shape("t", 1, 2, 2, 4, torch.float32, (8,), (64,)), 36
    rounds, seconds, ran, timed = random.randint(2, 4), random.uniform(0.5, 5), [], []
    drift = {name: [random.uniform(1, 2) for _ in range(rounds)] for name in "ab"}

    def peer(name):
        return peers.Peer(name, lambda q, k, v: ran.append(name) or q.clone())

    def fake_sustained_ms(run_fn, secs):
        run_fn()
        timed.append((ran[-1], secs))
        return drift[ran[-1]][sum(name == ran[-1] for name, _ in timed) - 1]

    def no_do_bench(run_fn, rep=100):
        raise AssertionError("do_bench timed a sustained round")

    monkeypatch.setattr(measure, "sustained_ms", fake_sustained_ms)
    monkeypatch.setattr(measure, "median_ms", no_do_bench)
    monkeypatch.setattr(measure, "peak_mib", lambda run_fn: 0.0)
    rows = case.measure_peers([peer("a"), peer("b")], rounds=rounds, sustained=seconds)
    assert timed == [(name, seconds) for _ in range(rounds) for name in "ab"]
    for row in rows:
        assert row["fwd"]["round_ms"] == drift[row["peer"]]
        assert row["fwd"]["ms"] == statistics.median(drift[row["peer"]])


def test_sustained_seconds_are_checked_and_named_in_the_result():
    args = run.parse_args(["--masks", "causal", "--rounds", "2", "--sustained", "3"])
    assert args.sustained == 3.0
    assert run.result_name("H100", args) == "suite_H100_causal_r2_sustained3s.json"
    assert run.parse_args([]).sustained is None
    for bad in ("0", "-1"):
        with pytest.raises(SystemExit):
            run.parse_args(["--sustained", bad])


@pytest.mark.gpu
def test_sustained_ms_is_milliseconds_per_call():
    a = torch.randn(2048, 2048, device="cuda")

    def matmul():
        return a @ a

    per_call = measure.sustained_ms(matmul, 0.2)
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(50):
        matmul()
    stop.record()
    torch.cuda.synchronize()
    assert per_call == pytest.approx(start.elapsed_time(stop) / 50, rel=0.5)


class _RecordsEnviron(torch.autograd.Function):
    """Identity whose forward and backward note OMNI_HF_DISABLE_SM90 as they run."""

    seen: list[tuple[str, str | None]] = []

    @staticmethod
    def forward(ctx, q):
        _RecordsEnviron.seen.append(("forward", peers.os.environ.get("OMNI_HF_DISABLE_SM90")))
        return q.clone()

    @staticmethod
    def backward(ctx, grad):
        _RecordsEnviron.seen.append(("backward", peers.os.environ.get("OMNI_HF_DISABLE_SM90")))
        return grad


def test_a_peer_environment_covers_its_backward_as_well_as_its_forward(monkeypatch):
    # The sm80 peer once set its variable inside fn only, so autograd's later backward ran the Hopper kernel.
    monkeypatch.delenv("OMNI_HF_DISABLE_SM90", raising=False)
    monkeypatch.setattr(run.Case, "_check", lambda self, run_fn, want, names, **options: (run_fn(), {})[1])
    case = run.Case.__new__(run.Case)
    case.backward, case.want_fwd, case.want_fwd_bwd = True, None, None
    case.q = torch.randn(1, 2, 8, 4)
    case.k = case.v = torch.randn(1, 2, 8, 4)
    case.dout = torch.randn(1, 2, 8, 4)
    _RecordsEnviron.seen = []
    peer = peers.Peer("probe", lambda q, k, v: _RecordsEnviron.apply(q), environ={"OMNI_HF_DISABLE_SM90": "1"})
    case.measure_peers([peer])
    assert _RecordsEnviron.seen == [("forward", "1"), ("forward", "1"), ("backward", "1")]
    assert "OMNI_HF_DISABLE_SM90" not in peers.os.environ


def test_check_reports_each_tensor_and_fails_past_the_tolerance_or_on_nan():
    want = torch.randn(1000)
    close = want + 1e-4 * torch.randn(1000)
    errors = measure.check((close, want), (want, want), ("out", "dq"))
    assert errors["dq"] == 0 and 0 < errors["out"] < measure.MAX_REL_ERR
    with pytest.raises(measure.CheckFailed, match="dq rel err"):
        measure.check((close, want + 0.1 * want.norm() / math.sqrt(1000)), (want, want), ("out", "dq"))
    nan = want.clone()
    nan[3] = float("nan")
    with pytest.raises(measure.CheckFailed, match="out"):
        measure.check((nan,), (want,), ("out",))


def test_skip_reason_separates_unsupported_inputs_from_failures():
    assert "out of memory" in measure.skip_reason(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate"))
    assert "backend" in measure.skip_reason(RuntimeError("No available kernel. Aborting execution."))
    assert measure.skip_reason(ValueError("q: expected 4 dims")) is None


def test_quick_plan_runs_every_mask_once_per_shape():
    args = run.parse_args(["--quick"])
    cases = run.plan(args)
    assert len(cases) == len(run.SHAPES) * len(layouts.MASKS)
    assert {(shape.name, s) for shape, _, s in cases} == {(n, s) for n, ls in run.QUICK_SEQLENS.items() for s in ls}
    chosen = run.plan(run.parse_args(["--masks", "vlm", "--shapes", "small", "--seqlens", "640"]))
    assert [(shape.name, mask, s) for shape, mask, s in chosen] == [("small", "vlm", 640)]
    with pytest.raises(SystemExit):
        run.parse_args(["--masks", "vlm,bogus"])


def test_head_dims_run_every_shape_at_each_with_their_heads():
    args = run.parse_args(["--shapes", "realistic", "--masks", "vlm,causal", "--seqlens", "8192",
                           "--head-dims", "256:8/4,80"])
    cases = run.plan(args)
    base = run.SHAPES["realistic"]
    assert [(s.name, s.dim, s.heads_q, s.heads_kv, m) for s, m, _ in cases] == [
        ("realistic_d256", 256, 8, 4, "vlm"), ("realistic_d256", 256, 8, 4, "causal"),
        ("realistic_d80", 80, base.heads_q, base.heads_kv, "vlm"), ("realistic_d80", 80, base.heads_q, base.heads_kv,
                                                                    "causal")]
    assert "d256-80" in run.result_name("H100", args)
    for bad in ("72:16", "100", "264", "64:6/4", "x"):
        with pytest.raises(SystemExit):
            run.parse_args(["--head-dims", bad])


def synthetic_result(rng: random.Random) -> dict:
    """A result of two lengths with timings drawn at random, a skipped and a failed entry."""
    cases = []
    for seq_len in (1024, 2048):
        pairs = rng.randint(1, seq_len * seq_len)
        rows = []
        for peer in ("omni b128", "flex", "sdpa-eff+mask", "eager"):
            entries = {}
            for mode in report.MODES:
                ms = rng.uniform(0.1, 10)
                entries[mode] = {"ms": ms, "tflops": rng.uniform(1, 500), "peak_mib": rng.uniform(0, 900),
                                 "errors": {"out": rng.uniform(0, 1e-2)}}
            rows.append({"peer": peer, "mask_mib": rng.uniform(0, 10), **entries})
        rows[2]["fwd_bwd"] = {"skipped": "out of memory (OutOfMemoryError: CUDA out of memory)"}
        rows[3]["fwd"] = {"failed": "check: out rel err 3.0e-01 (> 2e-02)"}
        cases.append({"shape": "small", "mask": "vlm", "seq_len": seq_len, "batch": 1, "heads_q": 8, "heads_kv": 8,
                      "head_dim": 64, "dtype": "float16", "window": None, "allowed_pairs": pairs,
                      "density": pairs / seq_len ** 2, "omni_builder": "from_token_ids",
                      "build_ms": {"omni b128": {"first": 3.0, "median": rng.uniform(0.1, 2)}},
                      "reference_mask": "layout dense", "reference_s": 0.1, "rows": rows})
    return {"meta": {"device": "Test GPU", "torch": torch.__version__, "triton": "x", "transformers": "y",
                     "cuda": "z", "omni_path": "sm80 (mma.sync)"}, "cases": cases}


def test_json_round_trips_and_tables_show_speedups_skips_and_failures(tmp_path):
    result = synthetic_result(random.Random(fresh_seed()))
    path = report.write_json(tmp_path / "sub" / "r.json", result)
    again = report.read_json(path)
    assert again == result
    assert report.summary(again, full=True) == report.summary(result, full=True)
    case = result["cases"][1]
    times = {row["peer"]: row["fwd"].get("ms") for row in case["rows"]}
    assert report.speedup_vs_flex(case, "omni b128", "fwd") == pytest.approx(times["flex"] / times["omni b128"])
    line = report.speed_table(result["cases"]).splitlines()[2]  # header, first case, second case
    omni = case["rows"][0]
    assert f"{omni['fwd']['tflops']:.0f}/{omni['fwd_bwd']['tflops']:.0f}" in line
    assert f"{times['flex'] / times['omni b128']:.2f}/" in line
    assert "/oom" in line and "FAIL/" in line
    markdown = report.summary(result, markdown=True, full=True)
    assert "| mask | S | density | omni b128 | flex |" in markdown and "Test GPU" in markdown
    assert all(line.count("|") == markdown.splitlines()[3].count("|") for line in markdown.splitlines()[3:6])


def test_speed_table_adds_omnis_speedup_over_flex_flash_where_it_ran():
    result = synthetic_result(random.Random(fresh_seed()))
    assert "flex-flash" not in report.summary(result)
    case = result["cases"][0]
    flash = {"ms": case["rows"][1]["fwd"]["ms"] / 2, "tflops": 1.0, "peak_mib": 0.0, "errors": {"out": 0.0}}
    case["rows"].append({"peer": "flex-flash", "mask_mib": 0.0, "fwd": flash, "fwd_bwd": {"skipped": "cannot run: x"}})
    header, _, first = ([cell.strip() for cell in line.split("|")[1:-1]]
                        for line in report.speed_table(result["cases"], markdown=True).splitlines()[:3])
    assert header[-2:] == ["b128÷flex", "b128÷flex-flash"]
    assert first[header.index("flex-flash")] == "1/skip"
    assert first[-1] == f"{flash['ms'] / case['rows'][0]['fwd']['ms']:.2f}/-"


def test_partial_runs_get_their_own_result_names_and_merge_back():
    assert run.result_name("NVIDIA H200", run.parse_args([])) == "suite_NVIDIA_H200.json"
    partial = run.parse_args(["--shapes", "small", "--masks", "vlm,causal", "--quick"])
    assert run.result_name("NVIDIA H200", partial) == "suite_NVIDIA_H200_small_vlm-causal_quick.json"
    rng = random.Random(fresh_seed())
    first, second = synthetic_result(rng), synthetic_result(rng)
    for case in second["cases"]:
        case["shape"] = "realistic"
    merged = report.merge([first, second])
    assert merged["meta"] == first["meta"] and merged["cases"] == first["cases"] + second["cases"]
    assert list(report.by_shape(merged)) == ["small", "realistic"]
    second["meta"]["device"] = "Another GPU"
    with pytest.raises(ValueError, match="different GPUs"):
        report.merge([first, second])


def test_plot_writes_one_png_per_shape(tmp_path):
    pytest.importorskip("matplotlib")
    from benchmarks.plot import plot

    result = synthetic_result(random.Random(fresh_seed()))
    paths = plot(result, tmp_path)
    assert [p.name for p in paths] == ["speedup_small.png"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def on_the_cpu(monkeypatch):
    """`benchmarks.run` on the CPU: omni on its reference, Flex uncompiled, wall-clock times, no memory."""
    import time

    monkeypatch.setattr(run, "DEVICE", "cpu")
    monkeypatch.setattr(torch, "compile", lambda fn=None, **kwargs: fn)
    monkeypatch.setattr(measure, "peak_mib", lambda fn: 0.0)

    def wall_ms(fn, rep=100):
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    monkeypatch.setattr(measure, "median_ms", wall_ms)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_run_case_checks_every_peer_and_records_what_could_not_run(on_the_cpu, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    shape = run.Shape("small", 1, 4, 2, 64, torch.float32, (256,), (64, 128))
    record = run.run_case(shape, "prefix_lm", 256, backward=True)
    rows = {row["peer"]: row for row in record["rows"]}
    assert list(rows) == ["omni b64", "omni b128", "flex", "sdpa-eff+mask", "sdpa-cudnn+mask", "eager", "flex-flash"]
    assert {mode: rows["flex-flash"][mode] for mode in report.MODES} == {
        mode: {"skipped": "no CUDA device"} for mode in report.MODES}
    for name in ("omni b64", "omni b128", "eager"):
        for mode in report.MODES:
            assert rows[name][mode]["errors"]["out"] < 1e-5 and rows[name][mode]["ms"] > 0, (name, mode)
    assert set(rows["eager"]["fwd_bwd"]["errors"]) == {"out", "dq", "dk", "dv"}
    assert rows["flex"]["fwd"]["errors"]["out"] < 1e-5  # Flex runs no backward on a CPU: reported, not raised
    assert "failed" in rows["flex"]["fwd_bwd"] and "CPU" in rows["flex"]["fwd_bwd"]["failed"]
    assert "skipped" in rows["sdpa-cudnn+mask"]["fwd"]  # no such backend on a CPU
    assert record["allowed_pairs"] == layouts.build("prefix_lm", 256).allowed_pairs()
    assert set(record["build_ms"]) == {"omni b64", "omni b128", "flex"}

    def broken(*args, **kwargs):
        raise RuntimeError("no Flex today")

    monkeypatch.setattr("torch.nn.attention.flex_attention.create_block_mask", broken)
    record = run.run_case(shape, "causal", 256, backward=False)
    rows = {row["peer"]: row for row in record["rows"]}
    assert rows["flex"]["fwd"] == {"skipped": "flex not built: RuntimeError: no Flex today"}
    assert "ms" in rows["omni b128"]["fwd"] and "fwd_bwd" not in rows["omni b128"]
    monkeypatch.setattr(run.Case, "_reference", broken)
    record = run.run_case(shape, "vlm", 256, backward=False)
    assert record["rows"] == [] and record["error"] == "RuntimeError: no Flex today"
    assert "not run: small vlm S=256" in report.summary({"meta": {}, "cases": [record]})


@pytest.mark.gpu
@pytest.mark.slow
def test_one_case_on_the_gpu_checks_and_times_every_peer(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("OMNI_HF_BACKEND", "cuda")
    shape = run.Shape("small", 1, 4, 2, 64, torch.float16, (384,), (64, 128))
    record = run.run_case(shape, "vlm", 384, backward=True)
    by_peer = {row["peer"]: row for row in record["rows"]}
    assert {"omni b64", "omni b128", "flex", "sdpa-eff+mask", "eager"} <= set(by_peer)
    for name in ("omni b64", "omni b128", "flex", "eager"):
        for mode in report.MODES:
            entry = by_peer[name][mode]
            assert entry["ms"] > 0 and max(entry["errors"].values()) < measure.MAX_REL_ERR, (name, mode, entry)
    assert record["allowed_pairs"] == layouts.build("vlm", 384).allowed_pairs()


# --- README tables from the committed suite JSON (benchmarks.readme_tables) ---

REPO_ROOT = Path(__file__).resolve().parents[2]


def markdown_rows(table: str) -> list[list[str]]:
    """The cells of every body row of the markdown table(s) in ``table``."""
    rows = [line for line in table.splitlines() if line.startswith("|") and not line.startswith("|---")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[1:]]


def pair(row: dict, mode_values=("fwd", "fwd_bwd")) -> str:
    return " / ".join(str(round(row[mode]["tflops"])) for mode in mode_values)


def test_headline_table_shows_the_committed_json():
    from benchmarks import readme_tables

    result = report.read_json(REPO_ROOT / readme_tables.HEADLINE)
    table = readme_tables.headline_table(result)
    assert result["meta"]["device"] in table.splitlines()[0] and result["meta"]["torch"] in table.splitlines()[0]
    assert "benchmarks/results/attention/" in table.splitlines()[0]
    body = markdown_rows(table)
    assert len(body) == len(readme_tables.HEADLINE_CASES)
    for cells, (mask, seq_len) in zip(body, readme_tables.HEADLINE_CASES):
        case = next(c for c in result["cases"] if c["mask"] == mask and c["seq_len"] == seq_len)
        rows = {row["peer"]: row for row in case["rows"]}
        assert cells[1] == f"{seq_len // 1024}k"
        assert cells[2:5] == [pair(rows["omni b128"]), pair(rows["flex"]), pair(rows["flex-flash"])]
        sdpa = [row for peer, row in rows.items() if peer.startswith("sdpa") and "tflops" in row.get("fwd", {})]
        fastest = sorted(sdpa, key=lambda row: -row["fwd"]["tflops"])[0]
        assert cells[5].startswith(pair(fastest) + " (")
        for column, base in ((6, "flex"), (7, "flex-flash")):
            want = " / ".join(f"{rows[base][m]['ms'] / rows['omni b128'][m]['ms']:.2f}" for m in ("fwd", "fwd_bwd"))
            assert cells[column] == want


def test_suite_sections_show_every_committed_run():
    from benchmarks import readme_tables

    text = readme_tables.suite_sections(REPO_ROOT)
    for suite in readme_tables.SUITE_RUNS:
        result = report.read_json(REPO_ROOT / "benchmarks" / suite.path)
        assert f"[`{suite.path}`]({suite.path})" in text
        for case in result["cases"]:
            omni = next(row for row in case["rows"] if row["peer"] == "omni b128")
            line = f"| {case['mask']} | {case['seq_len']} | {case['density']:.3f} |"
            assert any(row.startswith(line) and f" {round(omni['fwd']['tflops'])}/{round(omni['fwd_bwd']['tflops'])} |"
                       in row for row in text.splitlines()), (suite.path, line)


def test_replace_between_keeps_the_rest_and_refuses_a_missing_pair():
    from benchmarks import readme_tables

    words = [f"w{random.randrange(10**6)}" for _ in range(6)]
    text = "\n".join([words[0], "<!-- x:start -->", words[1], words[2], "<!-- x:end -->", words[3]])
    assert readme_tables.replace_between(text, "x", "new\nbody", "f.md").split("\n") == [
        words[0], "<!-- x:start -->", "new", "body", "<!-- x:end -->", words[3]]
    for broken in (text.replace("<!-- x:end -->", ""), "<!-- x:end -->\n<!-- x:start -->", text + "\n<!-- x:start -->"):
        with pytest.raises(ValueError, match="f.md: expected one line '<!-- x:start -->'"):
            readme_tables.replace_between(broken, "x", "body", "f.md")


def test_check_flags_stale_files_and_writing_makes_them_current(tmp_path, capsys):
    import shutil

    from benchmarks import readme_tables

    for json_path in [readme_tables.HEADLINE] + [f"benchmarks/{suite.path}" for suite in readme_tables.SUITE_RUNS]:
        (tmp_path / json_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / json_path, tmp_path / json_path)
    for target in (readme_tables.README, readme_tables.BENCHMARKS_README):
        (tmp_path / target.path).write_text(f"# top\n<!-- {target.marker}:start -->\nold\n"
                                            f"<!-- {target.marker}:end -->\ntail\n")
    assert readme_tables.main(["--check", "--root", str(tmp_path)]) == 1
    assert "stale: README.md, benchmarks/README.md" in capsys.readouterr().out
    assert readme_tables.main(["--root", str(tmp_path)]) == 0
    readme = (tmp_path / "README.md").read_text()
    assert readme.startswith("# top\n<!-- results-table:start -->\nOne ") and readme.endswith(
        "<!-- results-table:end -->\ntail\n")
    assert readme_tables.main(["--check", "--root", str(tmp_path)]) == 0
    (tmp_path / "README.md").write_text("no markers\n")
    assert readme_tables.main(["--check", "--root", str(tmp_path)]) == 1
    assert readme_tables.main(["--root", str(tmp_path)]) == 2


def test_committed_readmes_are_current_where_they_carry_the_markers():
    from benchmarks import readme_tables

    for target, body in readme_tables.rendered(REPO_ROOT).items():
        text = (REPO_ROOT / target.path).read_text()
        if f"<!-- {target.marker}:start -->" in text:
            assert readme_tables.replace_between(text, target.marker, body, target.path) == text, (
                f"{target.path} is stale: run python -m benchmarks.readme_tables")


# --------------------------------------------------------------- the longest-row search of bench_context_parallel


@pytest.mark.parametrize("seed", range(5))
def test_the_longest_row_search_brackets_the_limit(monkeypatch, seed):
    """Against a GPU whose limit is a random length: the search returns the longest multiple of its resolution tried
    that fits and a shorter-than-coarse bracket around the limit, from first guesses above and below it."""
    from benchmarks import bench_context_parallel as bench

    gen = random.Random(fresh_seed())
    limit = gen.randrange(20_000, 400_000)
    monkeypatch.setattr(bench, "fits", lambda gpus, length, args, devices=None: length <= limit)
    args = type("Args", (), {"coarse": 16384, "resolution": 2048})()
    for guess in (16384 * gen.randrange(1, 6), 16384 * gen.randrange(20, 30)):
        found = bench.longest_row(2, guess, args)
        assert found["longest"] <= limit < found["shortest_failing"], (limit, found)
        assert found["shortest_failing"] - found["longest"] <= 2048
        assert all(t["fits"] == (t["length"] <= limit) for t in found["tries"])


def _fake_run(gpus: int, length: int) -> dict:
    """What `examples/context_parallel.py --json` writes, for ``gpus`` GPUs on a ``length``-token row."""
    cuts = [length // gpus] * (gpus - 1) + [length - length // gpus * (gpus - 1)]
    checked = {"loss_rel_diff": 1e-6, "grad_rel_diff": 1e-2, "grad_noise": 2e-2} if gpus > 1 else {}
    return {"gpus": gpus, "gpu": "NVIDIA H100 80GB HBM3", "torch": "2.x", "seq_len": length, "memory_gib": 80.0,
            "tokens_per_s": 1000.0 * gpus, "imbalance": 0.01, "step_s": [1.0],
            "per_rank": {"tokens": cuts, "attention_ms": [1.0] * gpus, "static_memory_gib": [8.0 / gpus] * gpus,
                         "peak_memory_gib": [8.0 / gpus + 40.0 / gpus] * gpus}, **checked}


def test_the_context_parallel_benchmark_resumes_from_its_parts(monkeypatch, tmp_path, capsys):
    """A speed call, then a capacity call that reuses its runs and searches the GPU counts side by side on disjoint
    GPUs: the JSON's capacity ratio is the searched limits' and lies in its bounds; a capacity call on another kind
    of GPU than the searches so far is refused."""
    from benchmarks import bench_context_parallel as bench

    gen = random.Random(fresh_seed())
    limits = {gpus: gen.randrange(20_000, 60_000) * gpus for gpus in (1, 2, 4)}
    launched, placed = [], []
    monkeypatch.setattr(bench, "launch", lambda gpus, length, args, *extra, devices=None:
                        launched.append((gpus, extra)) or _fake_run(gpus, length))
    monkeypatch.setattr(bench, "fits", lambda gpus, length, args, devices=None:
                        placed.append((gpus, devices)) or length <= limits[gpus])
    monkeypatch.setattr(bench, "gpu_names", lambda: ["NVIDIA H100 80GB HBM3"] * 4)
    monkeypatch.setattr(bench, "gpu_memory_gib", lambda: 80.0)
    monkeypatch.setattr(bench, "driver_version", lambda: "test")
    common = ["--gpus", "2", "4", "--model", "tiny", "--length", "4096", "--resolution", "1024", "--out", str(tmp_path)]

    monkeypatch.setattr(sys, "argv", ["bench", *common, "--parts", "speed"])
    bench.main()
    assert sorted(gpus for gpus, _ in launched) == [1, 2, 4]
    assert all(("--check" in extra) == (gpus > 1) for gpus, extra in launched)
    monkeypatch.setattr(sys, "argv", ["bench", *common, "--parts", "capacity", "--concurrent"])
    bench.main()
    assert len(launched) == 3, "the capacity call ran a speed run again instead of reusing it"
    assert {devices for gpus, devices in placed if gpus == 4} == {"0,1,2,3"}
    assert {devices for gpus, devices in placed if gpus < 4} == {"0,1", "2"}  # side by side, disjoint
    for gpus in (2, 4):
        result = json.loads((tmp_path / f"context_parallel_{gpus}xh100.json").read_text())
        found = result["longest_row"]
        assert result["capacity_ratio"] == found[str(gpus)]["longest"] / found["1"]["longest"]
        low, high = result["capacity_ratio_bounds"]
        assert low <= limits[gpus] / limits[1] < high
        assert result["speedup"] == gpus and 0 < result["predicted"]["speedup"] <= gpus
    assert "| 4 | 4,000 | 4.00x" in capsys.readouterr().out

    monkeypatch.setattr(bench, "gpu_names", lambda: ["NVIDIA H200"] * 4)
    (tmp_path / "parts" / "tiny_fsdp2_4096" / "longest_row_4.json").unlink()
    with pytest.raises(SystemExit, match="NVIDIA H100 80GB HBM3"):
        bench.main()


def test_peers_are_chosen_by_the_starts_of_their_names():
    from benchmarks.peers import Peer

    assert run.parse_args([]).peers is None
    assert run.parse_args(["--peers", "omni, sdpa"]).peers == ("omni", "sdpa")
    with pytest.raises(SystemExit):
        run.parse_args(["--peers", "omni,,sdpa"])
    case_peers = [Peer("omni b128"), Peer("flex (triton)"), Peer("sdpa cudnn"), Peer("omni b128 sm80")]
    assert [p.name for p in run.chosen_peers(case_peers, ("omni",))] == ["omni b128", "omni b128 sm80"]
    assert [p.name for p in run.chosen_peers(case_peers, ("sdpa", "flex"))] == ["flex (triton)", "sdpa cudnn"]
    assert run.chosen_peers(case_peers, None) == case_peers
    assert run.result_name("H100", run.parse_args(["--peers", "omni"])) == "suite_H100_peers-omni.json"
