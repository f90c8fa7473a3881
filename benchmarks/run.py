"""omni vs torch.compile(flex_attention) (Triton and FLASH backends) vs SDPA (each backend) vs eager: every peer in
one run, on one GPU.

    python -m benchmarks.run [--quick] [--shapes realistic,small] [--masks causal,vlm,...] [--seqlens 4096,8192]
                             [--no-backward] [--omni-sm80] [--rounds N] [--sustained SECONDS]
                             [--head-dims D:HQ/HKV,...] [--peers omni,...] [--out DIR]

For every shape, mask (`benchmarks.layouts.MASKS`) and length: build each peer's mask once (timed from
the layout's ids or table in host memory: omni's builder on the GPU, Flex's compiled ``create_block_mask``
on the GPU, the collator on the CPU for the VLM layout), draw fresh random inputs, compute the float32 reference
(`omni_hf.ops.reference` with the layout's
own dense mask), then for each peer check its output (and, with backward, its gradients) against the
reference and only then time it: median ms by ``triton.testing.do_bench`` (or, with ``--sustained``, seconds of
calls back to back at the GPU's power cap, as in a training step), TFLOP/s over the allowed pairs
(4 * D flops per pair forward, 2.5x that backward), peak memory. One progress line per case; at the end a
table on stdout, ``suite_<GPU>.json`` (a partial run's name adds what it chose: `result_name`) and
``speedup_<shape>.png`` in ``--out`` (default ``$OUT`` if set, else ``benchmarks/results/``); the JSON is
rewritten after every case. `benchmarks.report` and `benchmarks.plot` redo the tables and plots from one
or several JSONs (e.g. ``--shapes realistic`` and ``--shapes small`` run as two calls).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import os
import platform
import shlex
import statistics
import sys
import time
import zlib
from pathlib import Path

import torch

from benchmarks import layouts, measure, peers, report

RESULTS = Path(__file__).resolve().parent / "results"
DEVICE = "cuda"


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    heads_q: int
    heads_kv: int
    dim: int
    dtype: torch.dtype
    seqlens: tuple[int, ...]
    blocks: tuple[int, ...]  # omni block sizes (each its own peer)


SHAPES = {
    "realistic": Shape("realistic", 1, 32, 8, 128, torch.bfloat16, (4096, 8192, 16384, 32768), (128,)),
    "small": Shape("small", 1, 8, 8, 64, torch.float16, (512, 1024, 2048), (64, 128)),
}
QUICK_SEQLENS = {"realistic": (8192,), "small": (1024,)}


class Case:
    """One shape, mask and length on the GPU: the masks of every peer, the inputs and the reference."""

    def __init__(self, shape: Shape, layout: layouts.Layout, backward: bool, omni_sm80: bool = False):
        self.shape, self.layout, self.backward, self.omni_sm80 = shape, layout, backward, omni_sm80
        seq_len, device = layout.seq_len, DEVICE
        self.scale = shape.dim ** -0.5
        self.pairs = layout.allowed_pairs()
        self.build_ms: dict[str, dict[str, float]] = {}
        self.why_missing: dict[str, str] = {}  # peer masks that could not be built, and why
        self.omni_masks = [self._timed(f"omni b{b}", lambda b=b: self._omni_mask(b)) for b in shape.blocks]
        from torch.nn.attention.flex_attention import create_block_mask

        compiled = torch.compile(create_block_mask)  # as Flex's docs advise for long sequences
        self.flex_mask = self._optional("flex", lambda: self._timed("flex", lambda: self._flex_mask(compiled)))
        if layout.name == "vlm":
            self._optional("collator", self._time_collator)
        self.dense = self._optional("dense", lambda: layout.dense(device))
        gen = torch.Generator(device=device).manual_seed(zlib.crc32(f"{shape.name} {layout.name} {seq_len}".encode()))
        q_shape = (shape.batch, shape.heads_q, seq_len, shape.dim)
        kv_shape = (shape.batch, shape.heads_kv, seq_len, shape.dim)
        self.q, self.k, self.v, self.dout = (torch.randn(s, generator=gen, device=device, dtype=shape.dtype)
                                             for s in (q_shape, kv_shape, kv_shape, q_shape))
        start = time.perf_counter()
        self.want_fwd, self.want_fwd_bwd = self._reference()
        self.reference_s = time.perf_counter() - start

    def _omni_mask(self, block: int):
        ids = self.layout.token_ids(DEVICE) if self.layout.token_rule else None
        return self.layout.omni_mask(block, DEVICE, ids)

    def _optional(self, name: str, build):
        """``build()``, or None with the reason kept in `why_missing` (its peers are then skipped)."""
        try:
            return build()
        except Exception as err:  # noqa: BLE001 - one peer's mask failing must not stop the others
            self.why_missing[name] = f"{name} not built: {measure.describe_error(err)}"
            return None

    def _flex_mask(self, create_block_mask):
        seq_len = self.layout.seq_len
        return create_block_mask(self.layout.mask_mod(DEVICE), None, None, seq_len, seq_len, device=DEVICE)

    def _timed(self, name: str, build):
        first, median = measure.build_ms(build, repeats=5, cuda=DEVICE == "cuda")
        self.build_ms[name] = {"first": first, "median": median}
        return build()

    def _time_collator(self) -> None:
        from omni_hf import OmniCollator

        samples = layouts.collator_samples(self.layout)
        for block in self.shape.blocks:
            collate = OmniCollator(0, mode="pack", max_length=self.layout.seq_len, return_block_mask=True,
                                   block_size=block)
            first, median = measure.build_ms(lambda: collate(samples), repeats=5, cuda=False)
            self.build_ms[f"collator b{block}"] = {"first": first, "median": median}

    def _reference(self):
        """float32 out and (with backward) out, dq, dk, dv of `omni_hf.ops.reference` on the layout's dense mask
        (omni's own mask where the dense one did not fit)."""
        from omni_hf.ops import reference

        mask = self.dense if self.dense is not None else self.omni_masks[-1]  # omni's mask is checked in tests
        qf, kf, vf = (t.float() for t in (self.q, self.k, self.v))
        out, lse = reference.attention_forward(qf, kf, vf, mask, self.scale)
        if not self.backward:
            return (out,), None
        grads = reference.attention_backward(self.dout.float(), qf, kf, vf, out, lse, mask, self.scale)
        return (out,), (out, *grads)

    def flops(self, mode: str) -> float:
        per_pass = 4.0 * self.shape.dim * self.shape.heads_q * self.shape.batch * self.pairs
        return per_pass * (3.5 if mode == "fwd_bwd" else 1.0)

    def peers(self) -> list[peers.Peer]:
        shape = self.shape
        return peers.for_case(self.omni_masks, self.flex_mask, self.dense, is_causal=self.layout.is_causal,
                              heads_q=shape.heads_q, heads_kv=shape.heads_kv, scale=self.scale,
                              why_missing=self.why_missing, omni_sm80=self.omni_sm80)

    def measure_peers(self, case_peers: list[peers.Peer], rounds: int = 1,
                      sustained: float | None = None) -> list[dict]:
        """The rows of ``case_peers`` (``fwd`` and ``fwd_bwd`` entries, see `benchmarks.report`). Every peer is
        checked against the reference first; then the runs that passed are timed in ``rounds`` rounds, each
        timing every run once in turn (``100 / rounds`` ms of repeats, or ``sustained`` seconds back to back), so
        that drift of the host or the GPU during the case falls on all peers alike. A run's ``ms`` is the median of
        its rounds' times (``round_ms``)."""
        rows, timed = [], []
        for peer in case_peers:
            row = {"peer": peer.name, "mask_mib": round(peer.mask_mib, 2)}
            for mode, (make_run, want, names) in self._modes().items():
                run = make_run(peer)
                with peer.running():
                    row[mode] = {"skipped": peer.skipped} if peer.skipped else self._check(
                        run, want, names, errors_skip=peer.errors_skip)
                if "errors" in row[mode]:
                    timed.append((peer, mode, run, row[mode]))
                torch.cuda.empty_cache()
            rows.append(row)
        for _ in range(rounds):
            for peer, mode, run, entry in timed:
                if "errors" in entry:  # not failed in an earlier round
                    with peer.running():
                        self._time_round(run, entry, rounds, sustained)
        for _, mode, _, entry in timed:
            if "errors" in entry:
                entry["ms"] = statistics.median(entry["round_ms"])
                entry["tflops"] = self.flops(mode) / entry["ms"] * 1e-9
        return rows

    def _modes(self) -> dict:
        """mode -> (a function making a peer's run, the reference's tensors, their names)."""
        modes = {"fwd": (lambda peer: measure.forward_fn(peer.fn, self.q, self.k, self.v), self.want_fwd, ("out",))}
        if self.backward:
            modes["fwd_bwd"] = (lambda peer: measure.forward_backward_fn(peer.fn, self.q, self.k, self.v, self.dout),
                                self.want_fwd_bwd, ("out", "dq", "dk", "dv"))
        return modes

    def _check(self, run, want: tuple[torch.Tensor, ...], names: tuple[str, ...], errors_skip: bool = False) -> dict:
        """``run``'s errors against ``want`` and its peak memory, or why it failed; with ``errors_skip``, an
        error it raises (not a failed check) is recorded as the reason it was skipped."""
        try:
            got = run()
            errors = measure.check(got if isinstance(got, tuple) else (got,), want, names)
            del got
            return {"errors": errors, "peak_mib": measure.peak_mib(run)}
        except measure.CheckFailed as err:
            return {"failed": f"check: {err}"}
        except Exception as err:  # noqa: BLE001 - a peer that breaks is reported; the others still run
            return self._broken(err, errors_skip)

    @staticmethod
    def _broken(err: Exception, errors_skip: bool) -> dict:
        reason = measure.skip_reason(err) or (f"cannot run: {peers.error_text(err)}" if errors_skip else None)
        return {"skipped": reason} if reason else {"failed": measure.describe_error(err)}

    def _time_round(self, run, entry: dict, rounds: int, sustained: float | None = None) -> None:
        """One round's ms of ``run`` appended to ``entry["round_ms"]``: the median of ``100 / rounds`` ms of
        `measure.median_ms`, or with ``sustained`` the mean of that many seconds back to back
        (`measure.sustained_ms`); an error (out of memory) replaces the entry by its reason."""
        try:
            ms = measure.sustained_ms(run, sustained) if sustained else measure.median_ms(run, rep=100 / rounds)
            entry.setdefault("round_ms", []).append(ms)
        except Exception as err:  # noqa: BLE001
            reason = self._broken(err, errors_skip=False)
            entry.clear()
            entry.update(reason)

    def record(self, rows: list[dict]) -> dict:
        return self.record_of(self.shape, self.layout, rows, build_ms=self.build_ms, why_missing=self.why_missing,
                              reference_mask="layout dense" if self.dense is not None else "omni (no dense mask)",
                              reference_s=round(self.reference_s, 3))

    @staticmethod
    def record_of(shape: Shape, layout: layouts.Layout, rows: list[dict], **extra) -> dict:
        """A case's JSON record: its shape, mask and length, ``extra`` fields, and the peers' ``rows``."""
        pairs = layout.allowed_pairs()
        return {"shape": shape.name, "mask": layout.name, "seq_len": layout.seq_len, "batch": shape.batch,
                "heads_q": shape.heads_q, "heads_kv": shape.heads_kv, "head_dim": shape.dim,
                "dtype": str(shape.dtype).split(".")[-1], "window": layout.window, "allowed_pairs": pairs,
                "density": pairs / layout.seq_len ** 2, "omni_builder": layout.omni_builder,
                "build_ms": {}, **extra, "rows": rows}


def run_case(shape: Shape, mask: str, seq_len: int, backward: bool, omni_sm80: bool = False, rounds: int = 1,
             sustained: float | None = None, peer_names: tuple[str, ...] | None = None) -> dict:
    """The record of one case, its peers (those whose names start with one of ``peer_names``, or all) timed in
    ``rounds`` interleaved rounds (each ``sustained`` seconds back to back per peer, when given:
    `Case._time_round`); one that cannot be set up
    (omni's mask, the inputs or the reference fail) is recorded with its ``error`` and no rows, and the run goes
    on."""
    torch._dynamo.reset()  # a fresh compile per case: past the recompile limit flex falls back to eager
    layout = layouts.build(mask, seq_len)
    try:
        case = Case(shape, layout, backward, omni_sm80)
    except Exception as err:  # noqa: BLE001
        record = Case.record_of(shape, layout, rows=[], error=measure.describe_error(err))
    else:
        record = case.record(case.measure_peers(chosen_peers(case.peers(), peer_names), rounds, sustained))
        del case
    torch.cuda.empty_cache()
    return record


def chosen_peers(case_peers: list[peers.Peer], names: tuple[str, ...] | None) -> list[peers.Peer]:
    """The peers whose names start with one of ``names`` (all when None), in their order."""
    return case_peers if names is None else [peer for peer in case_peers if peer.name.startswith(names)]


def progress_line(record: dict, seconds: float) -> str:
    head = f"{record['shape']} {record['mask']} S={record['seq_len']}"
    if "error" in record:
        return f"{head}: not run: {record['error']}; case {seconds:.0f} s"
    cells = []
    for row in record["rows"]:
        cell = "/".join(report.cell(row.get(mode), "tflops", ".0f") for mode in report.MODES)
        cells.append(f"{row['peer']} {cell}")
    builds = ", ".join(f"{name} {b['median']:.2f}" for name, b in record["build_ms"].items())
    return (f"{head}: TFLOP/s fwd/f+b: {'; '.join(cells)}. Build ms: {builds}; "
            f"reference {record['reference_s']:.1f} s; case {seconds:.0f} s")


def environment() -> dict:
    """GPU, library versions and which omni library ran, and its kernel path: the library's Hopper forward
    (when it has one) takes masks of 128-key blocks on an sm_90 GPU unless ``OMNI_HF_DISABLE_SM90`` is set."""
    import transformers
    import triton

    from omni_hf.kernels import loader

    lib = loader.library_path()
    data = lib.read_bytes()
    major, minor = torch.cuda.get_device_capability()
    disabled = os.environ.get("OMNI_HF_DISABLE_SM90", "") not in ("", "0")
    hopper = "sm90 (wgmma): forward and backward with 128-key blocks; else sm80 (mma.sync)"
    return {
        "device": torch.cuda.get_device_name(), "capability": f"{major}.{minor}", "torch": torch.__version__,
        "triton": triton.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(), "python": platform.python_version(), "host": platform.node(),
        "omni_library": str(lib), "omni_library_sha256": hashlib.sha256(data).hexdigest()[:16],
        "omni_path": hopper if (major, minor) == (9, 0) and not disabled else "sm80 (mma.sync)",
        "OMNI_HF_DISABLE_SM90": os.environ.get("OMNI_HF_DISABLE_SM90"),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"one length per shape: {QUICK_SEQLENS}")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated of {tuple(SHAPES)}")
    parser.add_argument("--masks", default=",".join(layouts.MASKS), help=f"comma-separated of {layouts.MASKS}")
    parser.add_argument("--seqlens", default=None, help="comma-separated lengths for every shape (default: "
                        "each shape's own)")
    parser.add_argument("--no-backward", action="store_true", help="forward only")
    parser.add_argument("--omni-sm80", action="store_true", help="also time omni with OMNI_HF_DISABLE_SM90=1 "
                        "('omni b128 sm80', forward and backward), to compare the Hopper kernels with the sm_80 ones "
                        "in one run")
    parser.add_argument("--rounds", type=int, default=1, help="timing rounds per case, every peer once per round "
                        "(its ms: the median of its rounds); more rounds spread host or GPU drift over all peers")
    parser.add_argument("--sustained", type=float, default=None, metavar="SECONDS",
                        help="time each peer in each round by SECONDS of calls back to back (no L2 flush): the GPU "
                        "at its power cap, as in a training step (default: 100 / rounds ms of do_bench)")
    parser.add_argument("--head-dims", default=None, help="comma-separated head dims, each optionally with its "
                        "query / KV heads (e.g. 256:8/4,80:16/16): every shape runs at each (default: the shape's own)")
    parser.add_argument("--peers", default=None, help="comma-separated starts of the peer names to time, e.g. omni "
                        "(its kernels alone, no Flex compile); default: every peer")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: $OUT or benchmarks/results)")
    args = parser.parse_args(argv)
    args.peers = tuple(name.strip() for name in args.peers.split(",")) if args.peers else None
    if args.peers is not None and not all(args.peers):
        parser.error(f"--peers: expected comma-separated peer names, got {','.join(args.peers)!r}")
    if args.rounds < 1:
        parser.error(f"--rounds: expected an integer >= 1, got {args.rounds}")
    if args.sustained is not None and not args.sustained > 0:
        parser.error(f"--sustained: expected seconds > 0, got {args.sustained}")
    try:
        args.head_dims = parse_head_dims(args.head_dims)
    except ValueError as err:
        parser.error(f"--head-dims: {err}")
    for name, allowed in (("shapes", SHAPES), ("masks", layouts.MASKS)):
        bad = set(getattr(args, name).split(",")) - set(allowed)
        if bad:
            parser.error(f"--{name}: unknown {sorted(bad)}; expected some of {tuple(allowed)}")
    return args


def parse_head_dims(text: str | None) -> tuple[tuple[int, int | None, int | None], ...]:
    """``"256:8/4,80"`` -> ``((256, 8, 4), (80, None, None))``: head dims with their query / KV heads (None: the
    shape's own). Raises ValueError naming the item that does not parse."""
    if not text:
        return ()
    items = []
    for item in text.split(","):
        dim, _, heads = item.partition(":")
        try:
            heads_q, heads_kv = (int(h) for h in heads.split("/")) if heads else (None, None)
            items.append((int(dim), heads_q, heads_kv))
        except ValueError:
            raise ValueError(f"expected D or D:HQ/HKV items, got {item!r}") from None
        if items[-1][0] % 8 or not 8 <= items[-1][0] <= 256 or (heads_q and heads_q % heads_kv):
            raise ValueError(f"expected a head dim that is a multiple of 8 up to 256 and HKV dividing HQ, got {item!r}")
    return tuple(items)


def shapes_at_head_dims(shape: Shape, head_dims) -> list[Shape]:
    """``shape`` at each of `parse_head_dims`' head dims (named ``<shape>_d<D>``), or itself when none are given."""
    return [dataclasses.replace(shape, name=f"{shape.name}_d{dim}", dim=dim, heads_q=heads_q or shape.heads_q,
                                heads_kv=heads_kv or shape.heads_kv)
            for dim, heads_q, heads_kv in head_dims] or [shape]


def result_name(device: str, args: argparse.Namespace) -> str:
    """``suite_<GPU>.json`` for the default run; other runs add their shapes / masks / lengths / quick,
    so that they never overwrite it."""
    parts = [device.replace(" ", "_")]
    if args.shapes != ",".join(SHAPES):
        parts.append(args.shapes.replace(",", "-"))
    if args.masks != ",".join(layouts.MASKS):
        parts.append(args.masks.replace(",", "-"))
    if args.seqlens:
        parts.append(args.seqlens.replace(",", "-"))
    if args.head_dims:
        parts.append("d" + "-".join(str(dim) for dim, _, _ in args.head_dims))
    if args.quick:
        parts.append("quick")
    if args.no_backward:
        parts.append("fwd")
    if args.omni_sm80:
        parts.append("sm80")
    if args.rounds > 1:
        parts.append(f"r{args.rounds}")
    if args.sustained:
        parts.append(f"sustained{args.sustained:g}s")
    if args.peers:
        parts.append("peers-" + "-".join(name.replace(" ", "") for name in args.peers))
    return f"suite_{'_'.join(parts)}.json"


def plan(args: argparse.Namespace) -> list[tuple[Shape, str, int]]:
    """The (shape, mask, length) cases the arguments ask for, in run order."""
    cases = []
    for base in (SHAPES[name] for name in args.shapes.split(",")):
        if args.seqlens:
            seqlens = tuple(int(s) for s in args.seqlens.split(","))
        else:
            seqlens = QUICK_SEQLENS[base.name] if args.quick else base.seqlens
        for shape in shapes_at_head_dims(base, args.head_dims):
            cases += [(shape, mask, s) for mask in args.masks.split(",") for s in seqlens]
    return cases


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from omni_hf.kernels import loader

    if not loader.available():
        raise SystemExit(f"omni_hf CUDA library unavailable: {loader.load_error()}")
    os.environ.setdefault("OMNI_HF_BACKEND", "cuda")  # never time the reference by accident
    meta = environment()
    meta["flex_flash"] = {"unavailable": peers.flash_unavailable(), **peers.flash_environment()}  # why not, versions
    meta["command"] = "python -m benchmarks.run " + " ".join(map(shlex.quote, sys.argv[1:] if argv is None else argv))
    meta["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    print(f"{meta['device']}, torch {meta['torch']}, omni path {meta['omni_path']}: {meta['command']}", flush=True)
    print(f"flex-flash: {meta['flex_flash']['unavailable'] or 'flash_attn.cute imports'}; "
          + ", ".join(f"{name} {version}" for name, version in meta["flex_flash"].items()
                      if name != "unavailable" and version), flush=True)
    start, records = time.time(), []
    todo = plan(args)
    out_dir = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else RESULTS)
    path = out_dir / result_name(meta["device"], args)
    result = {"meta": meta, "cases": records}
    for index, (shape, mask, seq_len) in enumerate(todo, 1):
        case_start = time.time()
        records.append(run_case(shape, mask, seq_len, not args.no_backward, args.omni_sm80, args.rounds,
                                args.sustained, args.peers))
        print(f"[{index}/{len(todo)}] {progress_line(records[-1], time.time() - case_start)}", flush=True)
        meta["seconds"] = round(time.time() - start, 1)
        report.write_json(path, result)  # after every case, so a run cut short keeps what it measured
    try:
        from benchmarks.plot import plot

        pngs = [str(p) for p in plot(result, out_dir)]
    except ImportError as err:
        pngs = [f"no plots ({err}); make them with: python -m benchmarks.plot {path}"]
    print("\n" + report.summary(result))
    print(f"\nwrote {path}; {'; '.join(pngs)}")


if __name__ == "__main__":
    main()
