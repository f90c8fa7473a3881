"""Side-by-side summary of Nsight Compute reports exported as CSV: chosen details metrics, warp stalls per issued
instruction by reason, and from the SASS source page the share of stall samples by reason, instructions and stall
samples by opcode, and each report's hottest instructions.

    ncu --import NAME.ncu-rep --page details --csv > DIR/details_NAME.csv
    ncu --import NAME.ncu-rep --page raw --csv > DIR/raw_NAME.csv                                (optional)
    ncu --import NAME.ncu-rep --page source --csv --print-source sass > DIR/sass_NAME.csv        (optional)
    python benchmarks/results/profiles/ncu_summary.py DIR NAME [NAME ...] [--top 20]

Each section needs its export for every NAME. A NAME of the form REPORT#ID takes the kernel with that ID from a
report of several kernels (details and raw pages only). Runs anywhere (no GPU, no ncu): it reads only the CSV files.
"""

from __future__ import annotations

import argparse
import collections
import csv
from pathlib import Path

DETAILS = (
    "Duration", "Elapsed Cycles", "SM Active Cycles", "Executed Ipc Active", "Issue Slots Busy", "L2 Hit Rate",
    "DRAM Throughput", "Eligible Warps Per Scheduler", "Executed Instructions", "Grid Size", "Achieved Occupancy",
)
SAMPLES = "Warp Stall Sampling (All Samples)"


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def details(path: Path, kernel: str | None) -> dict[str, str]:
    """Metric name -> "value unit" of one kernel (ID `kernel`, or the only one) of a `--page details --csv` export."""
    rows = [r for r in csv.DictReader(path.open()) if kernel is None or r["ID"] == kernel]
    return {r["Metric Name"]: f'{r["Metric Value"]} {r["Metric Unit"]}'.strip() for r in rows}


def stalls_per_issue(path: Path, kernel: str | None) -> dict[str, float]:
    """Stall reason -> warp cycles stalled per issued instruction, of one kernel of a `--page raw --csv` export."""
    rows = list(csv.reader(path.open()))
    header, data = rows[0], [r for r in rows[2:] if kernel is None or r[0] == kernel]
    prefix, suffix = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
    return {h[len(prefix):-len(suffix)]: _number(data[0][i]) for i, h in enumerate(header)
            if h.startswith(prefix) and h.endswith(suffix)}


def source(path: Path) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the first kernel of a `--page source --csv --print-source sass` export (each kernel's page
    starts with a line naming it)."""
    rows = list(csv.reader(path.read_text().splitlines()[1:]))
    end = next((i for i, r in enumerate(rows) if r and r[0] == "Kernel Name"), len(rows))
    return rows[0], rows[1:end]


def opcode(sass: str) -> str:
    """The instruction's opcode without modifiers or predicate: "@!P0 BRA 0x..." -> "BRA"."""
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def source_summary(path: Path, top: int) -> dict:
    """Stall samples by reason and, by opcode, instructions executed and stall samples, of a source-page export;
    with its `top` instructions by stall samples as (row, % of samples, executions, SASS, main reason)."""
    header, rows = source(path)
    col = {name: i for i, name in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(_number(r[col[SAMPLES]]) for r in rows) or 1.0
    by_reason, executed, sampled = collections.Counter(), collections.Counter(), collections.Counter()
    for r in rows:
        op = opcode(r[col["Source"]])
        executed[op] += _number(r[col["Instructions Executed"]])
        sampled[op] += _number(r[col[SAMPLES]])
        for reason in reasons:
            by_reason[reason[len("stall_"):]] += _number(r[col[reason]])
    hottest = sorted(enumerate(rows), key=lambda item: -_number(item[1][col[SAMPLES]]))[:top]
    top_rows = [(i, 100 * _number(r[col[SAMPLES]]) / total, _number(r[col["Instructions Executed"]]),
                 r[col["Source"]].strip(), max(reasons, key=lambda reason: _number(r[col[reason]]))[len("stall_"):])
                for i, r in hottest]
    return {"total": total, "reasons": by_reason, "executed": executed, "sampled": sampled, "top": top_rows}


def _cells(values) -> str:
    return "".join(f"{v:>20}" for v in values)


def print_details(directory: Path, reports: list[tuple[str, str]]) -> None:
    print("details")
    tables = [details(directory / f"details_{r}.csv", k or None) for r, k in reports]
    for metric in DETAILS:
        print(f"  {metric:42s}{_cells(t.get(metric, '-') for t in tables)}")


def print_stalls_per_issue(directory: Path, reports: list[tuple[str, str]]) -> None:
    print("\nwarp cycles stalled per issued instruction, by reason (raw page)")
    stalls = [stalls_per_issue(directory / f"raw_{r}.csv", k or None) for r, k in reports]
    for reason in sorted(stalls[0], key=lambda k: -stalls[0][k]):
        if max(s[reason] for s in stalls) >= 0.1:
            print(f"  {reason:42s}{_cells(f'{s[reason]:.2f}' for s in stalls)}")


def print_source(directory: Path, names: list[str], top: int) -> None:
    summaries = [source_summary(directory / f"sass_{name}.csv", top) for name in names]
    print("\nwarp-stall samples by reason, % of each report's samples")
    for reason in sorted(summaries[0]["reasons"], key=lambda k: -summaries[0]["reasons"][k]):
        shares = [100 * s["reasons"][reason] / s["total"] for s in summaries]
        if max(shares) >= 0.5:
            print(f"  {reason:42s}{_cells(f'{v:.1f}' for v in shares)}")

    print("\nby opcode: instructions executed (millions) / % of stall samples")
    ops = sorted({op for s in summaries for op in s["executed"]},
                 key=lambda o: (-max(s["executed"][o] for s in summaries), o))
    for op in ops[:30]:
        values = [f'{s["executed"][op] / 1e6:.2f} / {100 * s["sampled"][op] / s["total"]:.1f}' for s in summaries]
        print(f"  {op:42s}{_cells(values)}")

    for name, s in zip(names, summaries):
        print(f"\n{name}: the {top} instructions with the most stall samples, in program order "
              "(row, % of samples, executions, SASS, main reason)")
        for row, share, count, sass, reason in sorted(s["top"]):
            print(f"  {row:5d} {share:5.1f}% {count / 1e6:6.2f}M  {sass[:64]:64s} {reason}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("names", nargs="+")
    parser.add_argument("--top", type=int, default=20, help="hottest instructions listed per report")
    args = parser.parse_args()
    reports = [name.partition("#")[::2] for name in args.names]  # (report, kernel ID or "")
    print(f"{'':44s}{_cells(args.names)}")
    if all((args.dir / f"details_{r}.csv").exists() for r, _ in reports):
        print_details(args.dir, reports)
    if all((args.dir / f"raw_{r}.csv").exists() for r, _ in reports):
        print_stalls_per_issue(args.dir, reports)
    if all((args.dir / f"sass_{r}.csv").exists() and not k for r, k in reports):
        print_source(args.dir, [r for r, _ in reports], args.top)


if __name__ == "__main__":
    main()
