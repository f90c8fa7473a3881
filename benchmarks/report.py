"""Results as JSON, and tables of them (stdout text or README markdown).

    python -m benchmarks.report RESULTS.json [MORE.json ...] [--markdown]

A result is ``{"meta": {...}, "cases": [case, ...]}``; a case is one mask at one length and shape with its
``rows``, one per peer, each holding ``fwd`` and ``fwd_bwd`` entries of either ``{"ms", "tflops",
"peak_mib", "errors"}``, ``{"skipped": reason}`` or ``{"failed": reason}``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

MODES = ("fwd", "fwd_bwd")
PEER_ORDER = ("omni b64", "omni b128", "omni b128 sm80", "flex", "flex-flash", "sdpa-fa2", "sdpa-cudnn", "sdpa-eff",
              "sdpa-eff+mask", "sdpa-cudnn+mask", "eager")


def write_json(path: Path, result: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, sort_keys=False) + "\n")
    return path


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def merge(results: list[dict]) -> dict:
    """One result from several (e.g. the shapes run in separate calls): the first one's meta, every case."""
    devices = {r["meta"].get("device") for r in results}
    if len(devices) > 1:
        raise ValueError(f"results from different GPUs {sorted(map(str, devices))} do not go in one table")
    return {"meta": results[0]["meta"], "cases": [case for r in results for case in r["cases"]]}


def speedup_vs_flex(case: dict, peer: str, mode: str, base: str = "flex") -> float | None:
    """``base``'s (Flex's) median time over ``peer``'s for one case and mode; None when either did not run."""
    times = {row["peer"]: row.get(mode, {}).get("ms") for row in case["rows"]}
    if times.get(base) and times.get(peer):
        return times[base] / times[peer]
    return None


def cell(entry: dict | None, key: str, fmt: str) -> str:
    if entry is None:
        return "-"
    if "failed" in entry:
        return "FAIL"
    if "skipped" in entry:
        return "oom" if "memory" in entry["skipped"] else "skip"
    return format(entry[key], fmt)


def peers_in(cases: list[dict]) -> list[str]:
    """The peers that ran in any of ``cases``, in report order."""
    ran = {row["peer"] for case in cases for row in case["rows"]
           if any("ms" in row.get(mode, {}) for mode in MODES)}
    return [p for p in PEER_ORDER if p in ran] + sorted(ran - set(PEER_ORDER))


def by_shape(result: dict) -> dict[str, list[dict]]:
    shapes: dict[str, list[dict]] = {}
    for case in result["cases"]:
        shapes.setdefault(case["shape"], []).append(case)
    return shapes


def _shape_title(case: dict) -> str:
    return (f"{case['shape']}: B={case['batch']} Hq={case['heads_q']} Hkv={case['heads_kv']} D={case['head_dim']} "
            f"{case['dtype']}")


def speed_table(cases: list[dict], markdown: bool = False) -> str:
    """TFLOP/s (over allowed pairs) of every peer, forward | forward+backward, and omni's speedup over
    flex (each omni block size) and, where it ran, over flex-flash, one line per mask and length."""
    peers = peers_in(cases)
    omnis = [p for p in peers if p.startswith("omni")]
    bases = ["flex"] + (["flex-flash"] if "flex-flash" in peers else [])
    speedups = [(p, base) for base in bases for p in omnis]
    header = ["mask", "S", "density"] + peers + [f"{p.removeprefix('omni ')}÷{base}" for p, base in speedups]
    lines = []
    for case in cases:
        rows = {row["peer"]: row for row in case["rows"]}
        cells = [case["mask"], str(case["seq_len"]), f"{case['density']:.3f}"]
        for peer in peers:
            row = rows.get(peer)
            cells.append("/".join(cell(row.get(mode) if row else None, "tflops", ".0f") for mode in MODES))
        for peer, base in speedups:
            cells.append("/".join(f"{s:.2f}" if (s := speedup_vs_flex(case, peer, mode, base)) else "-"
                                  for mode in MODES))
        lines.append(cells)
    return _format(header, lines, markdown)


def memory_table(cases: list[dict], markdown: bool = False) -> str:
    """Peak MiB of one call beyond its inputs, forward | forward+backward, and each peer's mask MiB."""
    peers = peers_in(cases)
    header = ["mask", "S"] + peers
    lines = []
    for case in cases:
        rows = {row["peer"]: row for row in case["rows"]}
        cells = [case["mask"], str(case["seq_len"])]
        for peer in peers:
            row = rows.get(peer)
            peaks = "/".join(cell(row.get(mode) if row else None, "peak_mib", ".0f") for mode in MODES)
            cells.append(f"{peaks} ({row['mask_mib']:.0f})" if row and row.get("mask_mib", 0) >= 1 else peaks)
        lines.append(cells)
    return _format(header, lines, markdown)


def build_table(cases: list[dict], markdown: bool = False) -> str:
    """Mask build times (median ms of warm calls; first call in brackets), one line per mask and length:
    omni's builder on the GPU, Flex's compiled ``create_block_mask`` on the GPU, the collator on the CPU."""
    names = list(dict.fromkeys(name for case in cases for name in case["build_ms"]))
    lines = [[case["mask"], str(case["seq_len"]), case["omni_builder"]]
             + [f"{b['median']:.2f} [{b['first']:.0f}]" if (b := case["build_ms"].get(name)) else "-" for name in names]
             for case in cases]
    return _format(["mask", "S", "omni builder"] + names, lines, markdown)


def _format(header: list[str], lines: list[list[str]], markdown: bool) -> str:
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(out + ["| " + " | ".join(cells) + " |" for cells in lines])
    widths = [max(len(str(x)) for x in column) for column in zip(header, *lines)]
    return "\n".join("  ".join(str(x).rjust(w) if i else str(x).ljust(w) for i, (x, w) in enumerate(zip(cells, widths)))
                     for cells in [header, *lines])


def summary(result: dict, markdown: bool = False, full: bool = False) -> str:
    """The speed table of every shape (with ``full``, the memory and build tables too), under a line
    naming the GPU and the library versions."""
    meta = result["meta"]
    versions = ", ".join(f"{name} {meta.get(name)}" for name in ("torch", "triton", "transformers", "cuda"))
    parts = [f"{meta.get('device', '?')} ({versions}); omni path: {meta.get('omni_path', '?')}"]
    parts += [f"not run: {c['shape']} {c['mask']} S={c['seq_len']}: {c['error']}"
              for c in result["cases"] if "error" in c]
    for cases in by_shape(result).values():
        title = _shape_title(cases[0])
        parts.append(f"\n{title}; TFLOP/s over allowed pairs, fwd/fwd+bwd")
        parts.append(speed_table(cases, markdown))
        if full:
            parts.append(f"\n{title}; peak MiB of one call beyond its inputs, fwd/fwd+bwd (mask MiB where >= 1)")
            parts.append(memory_table(cases, markdown))
            parts.append(f"\n{title}; mask build ms, median of warm calls [first call]")
            parts.append(build_table(cases, markdown))
    return "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description="Print the tables of benchmark result JSONs (one GPU).")
    parser.add_argument("json", type=Path, nargs="+")
    parser.add_argument("--markdown", action="store_true", help="markdown tables (for README.md)")
    args = parser.parse_args()
    print(summary(merge([read_json(path) for path in args.json]), markdown=args.markdown, full=True))


if __name__ == "__main__":
    main()
