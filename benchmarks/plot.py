"""Speedup-vs-Flex plots from a result JSON: one PNG per shape, a panel per mask, forward and fwd+bwd.

    python -m benchmarks.plot RESULTS.json [MORE.json ...] [--out DIR]

Needs matplotlib (``python3 -m pip install -e ".[bench]"``); writes ``speedup_<shape>.png`` beside the JSON unless
``--out`` says otherwise. Several JSONs of one GPU (shapes run in separate calls) plot together.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.report import MODES, PEER_ORDER, by_shape, merge, peers_in, read_json, speedup_vs_flex

MODE_TITLES = {"fwd": "forward", "fwd_bwd": "forward + backward"}


def _color(peer: str) -> str:
    """One colour per peer in every panel and figure."""
    index = PEER_ORDER.index(peer) if peer in PEER_ORDER else len(PEER_ORDER)
    return f"C{index % 10}"


def plot(result: dict, out_dir: Path) -> list[Path]:
    """Write one figure per shape; return their paths."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for shape, cases in by_shape(result).items():
        masks = list(dict.fromkeys(case["mask"] for case in cases))
        peers = [p for p in peers_in(cases) if p != "flex"]
        fig, axes = plt.subplots(len(MODES), len(masks), figsize=(3.2 * len(masks), 5.6), squeeze=False,
                                 sharex=True)
        for col, mask in enumerate(masks):
            mask_cases = sorted((c for c in cases if c["mask"] == mask), key=lambda c: c["seq_len"])
            for row, mode in enumerate(MODES):
                ax = axes[row][col]
                ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="flex")
                for peer in peers:
                    points = [(c["seq_len"], s) for c in mask_cases if (s := speedup_vs_flex(c, peer, mode))]
                    if points:
                        ax.plot(*zip(*points), marker="o", label=peer, color=_color(peer))
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
                ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
                ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
                ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
                ax.set_xticks([c["seq_len"] for c in mask_cases], [f"{c['seq_len'] // 1024}k" if c["seq_len"] >= 1024
                                                                   else str(c["seq_len"]) for c in mask_cases])
                ax.set_title(f"{mask}, {MODE_TITLES[mode]}", fontsize=9)
                ax.grid(alpha=0.3)
                if col == 0:
                    ax.set_ylabel("speedup vs flex (x)")
                if row == len(MODES) - 1:
                    ax.set_xlabel("sequence length")
        handles, labels = axes[0][0].get_legend_handles_labels()
        for ax in axes.flat:  # a peer absent from the first panel still gets a legend entry
            for h, lab in zip(*ax.get_legend_handles_labels()):
                if lab not in labels:
                    handles.append(h)
                    labels.append(lab)
        first = cases[0]
        fig.suptitle(f"{result['meta'].get('device', '?')}: {shape} (B={first['batch']} Hq={first['heads_q']} "
                     f"Hkv={first['heads_kv']} D={first['head_dim']} {first['dtype']}), higher is faster", fontsize=10)
        fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
        fig.tight_layout(rect=(0, 0.06, 1, 0.95))
        path = out_dir / f"speedup_{shape}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")  # a one-mask figure is narrower than its title and legend
        plt.close(fig)
        paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description="Plot speedup vs Flex from a benchmark result JSON.")
    parser.add_argument("json", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, default=None, help="folder for the PNGs (default: the first JSON's)")
    args = parser.parse_args()
    out_dir = args.out or args.json[0].parent
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in plot(merge([read_json(path) for path in args.json]), out_dir):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
