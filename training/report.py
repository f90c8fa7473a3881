"""The PNG plot of a run's metrics: losses on the left, held-out accuracy against the baselines on the right."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)


def plot(metrics: Mapping[str, Any], path: str | Path) -> None:
    """Train and held-out answer loss, and held-out exact-match accuracy per step, from the metrics JSON
    of `training.train_vlm` (``train``, ``eval``, ``baselines``, ``config``)."""
    train, evals = metrics["train"], metrics["eval"]
    figure, (losses, accuracy) = plt.subplots(1, 2, figsize=(11, 4))
    losses.plot([r["step"] for r in train], [r["loss"] for r in train], label="train", lw=1)
    losses.plot([r["step"] for r in evals], [r["loss"] for r in evals], "o-", label="held-out")
    losses.set(xlabel="step", ylabel="answer loss (nats / token)", yscale="log", title="loss")
    losses.legend()
    accuracy.plot([r["step"] for r in evals], [r["accuracy"] for r in evals], "o-", label="VLM")
    for (name, value), style in zip(metrics.get("baselines", {}).items(), ("--", ":")):
        accuracy.axhline(value, ls=style, color="gray", label=name.replace("_", " "))
    accuracy.set(xlabel="step", ylabel="exact-match accuracy", ylim=(0, 1), title="held-out answers")
    accuracy.legend()
    config = metrics["config"]
    figure.suptitle(f"{config['preset']} preset, attn={config['attn']}, mask={config['mask']}")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
