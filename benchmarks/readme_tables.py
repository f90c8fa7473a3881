"""README's results table and benchmarks/README.md's suite tables, written from the committed suite JSON.

    python -m benchmarks.readme_tables [--check]

Rewrites the text between the marker lines ``<!-- results-table:start -->`` and ``<!-- results-table:end -->`` in
README.md (`HEADLINE`: omni against Flex's Triton and FLASH backends and SDPA's best backend on the packed VLM mask
at 8k and 16k tokens and causal at 16k) and between ``<!-- benchmarks-tables:start -->`` and
``<!-- benchmarks-tables:end -->`` in benchmarks/README.md (every run in `SUITE_RUNS`, through
`benchmarks.report`'s tables). With ``--check`` nothing is written and the exit status is 1 when a file is stale.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import NamedTuple

from benchmarks import report

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = "benchmarks/results/attention"
HEADLINE = f"{RESULTS}/realistic_flex_flash_h100.json"
HEADLINE_CASES = (("vlm", 8192), ("vlm", 16384), ("causal", 16384))
MASK_NAMES = {"vlm": "packed VLM, 576-token images", "causal": "causal"}
SDPA_NAMES = {"sdpa-fa2": "FA2, is_causal", "sdpa-cudnn": "cuDNN, is_causal", "sdpa-eff": "mem-efficient, is_causal",
              "sdpa-eff+mask": "mem-efficient, Transformers' mask", "sdpa-cudnn+mask": "cuDNN, Transformers' mask"}


class SuiteRun(NamedTuple):
    """A committed suite JSON (relative to benchmarks/README.md's folder) and what its section shows."""

    title: str
    path: str
    builds: bool = False


SUITE_RUNS = (
    SuiteRun("The realistic shape with Flex's FLASH backend, 3 interleaved rounds (the newest library)",
             "results/attention/realistic_flex_flash_h100.json"),
    SuiteRun("Head dim 64, causal, 3 interleaved rounds (the newest library; Flex's FLASH backend refuses "
             "128-token blocks at 64)", "results/attention/realistic_d64_causal_h100.json"),
    SuiteRun("Head dim 256 (8 / 4 heads), 3 interleaved rounds (the newest library; Flex's FLASH backend refuses "
             "128-token blocks at 256)", "results/attention/realistic_d256_h100.json"),
    SuiteRun("At the power cap, packed VLM: each peer timed by 3 s of calls back to back, 2 interleaved rounds "
             "(the newest library)", "results/attention/power_cap_vlm_h100.json"),
    SuiteRun("At the power cap, causal (as above)", "results/attention/power_cap_causal_h100.json"),
    SuiteRun("At the power cap, head dim 64, causal", "results/attention/power_cap_d64_causal_h100.json"),
    SuiteRun("At the power cap, head dim 256 (8 / 4 heads), causal",
             "results/attention/power_cap_d256_causal_h100.json"),
    SuiteRun("Head dim 64, 3 interleaved rounds (the library before the warp-uniform wgmma operands; causal 32k "
             "missing)", "results/attention/realistic_d64_h100.json"),
    SuiteRun("The realistic shape, 5 interleaved rounds (the library before the stmatrix backward)",
             "results/attention/realistic_h100.json"),
    SuiteRun("Small shapes, 5 interleaved rounds", "results/attention/small_h100.json"),
    SuiteRun("Every mask, realistic shape", "results/attention/all_masks_realistic_h200.json", builds=True),
    SuiteRun("Every mask, small shapes", "results/attention/all_masks_small_h200.json"),
)


class Target(NamedTuple):
    """A file (relative to the repository root) and the name of its marker pair."""

    path: str
    marker: str


README = Target("README.md", "results-table")
BENCHMARKS_README = Target("benchmarks/README.md", "benchmarks-tables")


def kilo_tokens(seq_len: int) -> str:
    return f"{seq_len // 1024}k" if seq_len % 1024 == 0 else str(seq_len)


def tflops(row: dict | None) -> str:
    """``fwd / fwd+bwd`` TFLOP/s of one peer's row, ``-`` for a mode that did not run."""
    return " / ".join(f"{row[mode]['tflops']:.0f}" if row and "tflops" in row.get(mode, {}) else "-"
                      for mode in report.MODES)


def ratio(case: dict, peer: str, base: str) -> str:
    return " / ".join(f"{s:.2f}" if (s := report.speedup_vs_flex(case, peer, mode, base)) else "-"
                      for mode in report.MODES)


def best_sdpa(case: dict) -> dict | None:
    """The SDPA backend with the highest forward TFLOP/s in ``case`` (None when none ran)."""
    ran = [row for row in case["rows"] if row["peer"].startswith("sdpa") and "tflops" in row.get("fwd", {})]
    return max(ran, key=lambda row: row["fwd"]["tflops"], default=None)


def find_case(result: dict, mask: str, seq_len: int) -> dict:
    for case in result["cases"]:
        if (case["mask"], case["seq_len"]) == (mask, seq_len):
            return case
    raise KeyError(f"{mask} at {seq_len} tokens is not in the result")


def caption(meta: dict, case: dict) -> str:
    """``<GPU>, torch <version>, <date>; B.., heads, dtype``: the run's setting in one line."""
    return (f"{meta['device']}, torch {meta['torch']}, {meta.get('date', '?')[:10]}; B {case['batch']}, "
            f"{case['heads_q']} query / {case['heads_kv']} KV heads of {case['head_dim']}, {case['dtype']}")


def headline_table(result: dict) -> str:
    """README's table: omni, Flex (Triton), Flex (FLASH) and SDPA's best backend, forward / forward+backward
    TFLOP/s over the allowed pairs, and omni's ratio to each Flex backend, one line per `HEADLINE_CASES`."""
    cases = [find_case(result, mask, seq_len) for mask, seq_len in HEADLINE_CASES]
    lines = [f"One {caption(result['meta'], cases[0])}; TFLOP/s over the allowed pairs, forward / forward+backward "
             f"([`{RESULTS}/`]({RESULTS}/)):",
             "",
             "| mask | tokens | omni | Flex (Triton) | Flex (FLASH) | SDPA, best backend | omni / Flex (Triton) "
             "| omni / Flex (FLASH) |",
             "|---|---|---|---|---|---|---|---|"]
    for case in cases:
        rows = {row["peer"]: row for row in case["rows"]}
        sdpa = best_sdpa(case)
        sdpa_cell = f"{tflops(sdpa)} ({SDPA_NAMES.get(sdpa['peer'], sdpa['peer'])})" if sdpa else "-"
        lines.append(f"| {MASK_NAMES.get(case['mask'], case['mask'])} | {kilo_tokens(case['seq_len'])} "
                     f"| {tflops(rows.get('omni b128'))} | {tflops(rows.get('flex'))} "
                     f"| {tflops(rows.get('flex-flash'))} "
                     f"| {sdpa_cell} | {ratio(case, 'omni b128', 'flex')} | {ratio(case, 'omni b128', 'flex-flash')} |")
    return "\n".join(lines)


def suite_sections(root: Path) -> str:
    """benchmarks/README.md's tables: per `SUITE_RUNS` entry a caption (GPU, torch, date, command) and
    `benchmarks.report`'s speed table of each shape (and the mask-build table where asked)."""
    parts = []
    for run in SUITE_RUNS:
        result = report.read_json(root / "benchmarks" / run.path)
        meta = result["meta"]
        command = re.sub(r" --out \S+", "", meta.get("command", "?"))
        for shape_cases in report.by_shape(result).values():
            parts.append(f"**{run.title}** ([`{run.path}`]({run.path}): {caption(meta, shape_cases[0])}; "
                         f"`{command}`). TFLOP/s over the allowed pairs, forward/forward+backward:")
            parts.append(report.speed_table(shape_cases, markdown=True))
            if run.builds:
                parts.append("Mask builds of that run, ms (median of warm calls [first call]); omni and Flex on the "
                             "GPU, the collator on the CPU, each with the copy of the ids to the GPU:")
                parts.append(report.build_table(shape_cases, markdown=True))
    return "\n\n".join(parts)


def replace_between(text: str, marker: str, body: str, name: str) -> str:
    """``text`` with the lines between ``<!-- {marker}:start -->`` and ``<!-- {marker}:end -->`` replaced by
    ``body``; ValueError naming ``name`` when the pair is missing or out of order."""
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    lines = text.split("\n")
    if lines.count(start) != 1 or lines.count(end) != 1 or lines.index(start) > lines.index(end):
        raise ValueError(f"{name}: expected one line {start!r} followed by one line {end!r}")
    first, last = lines.index(start), lines.index(end)
    return "\n".join(lines[:first + 1] + body.split("\n") + lines[last:])


def rendered(root: Path) -> dict[Target, str]:
    """What each target's marked text should be, from the committed JSON under ``root``."""
    return {README: headline_table(report.read_json(root / HEADLINE)), BENCHMARKS_README: suite_sections(root)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.readme_tables", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file is stale")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    stale, unmarked = [], []
    for target, body in rendered(args.root).items():
        path = args.root / target.path
        text = path.read_text()
        try:
            new = replace_between(text, target.marker, body, target.path)
        except ValueError as err:
            print(err, file=sys.stderr)
            unmarked.append(target.path)
            continue
        if new != text:
            stale.append(target.path)
            if not args.check:
                path.write_text(new)
    verb = "stale" if args.check else "rewritten"
    print(f"{verb}: {', '.join(stale)}" if stale else "up to date" if not unmarked else "nothing else to do")
    if unmarked:
        return 1 if args.check else 2
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
