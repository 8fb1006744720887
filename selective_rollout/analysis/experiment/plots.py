"""``experiment.png``: per metric, each arm's mean over seeds and its seeds' values, and the
held-out change pooled over seeds with its CI."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from selective_rollout.analysis.experiment.schema import METRICS, PLOT_METRICS


def plot(
    path: Path,
    rows: list[dict[str, Any]],
    arms: list[str],
    pooled: list[dict[str, Any]] | None = None,
    panels: Sequence[str] = PLOT_METRICS,
) -> None:
    """Bars (means) and dots (seeds) of ``panels`` (the held-out change's always among them); its panel also
    draws, per arm, the change pooled over seeds with its CI over tasks (``pooled_held_out``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(panels) if "success_gain" in panels else [*panels, "success_gain"]
    fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 3.6))
    for ax, key in zip(axes, keys, strict=True):
        for i, arm in enumerate(arms):
            vals = [r[key] for r in rows if r["arm"] == arm and r.get(key) is not None]
            if vals:
                ax.bar(i, np.mean(vals), color=f"C{i}", alpha=0.6)
                ax.scatter([i] * len(vals), vals, color="k", s=12, zorder=3)
        ax.set_xticks(range(len(arms)), arms, rotation=20, fontsize=8)
        ax.set_title(METRICS[key], fontsize=9)
    change = axes[keys.index("success_gain")]
    title = "held-out change (after - before)"
    change.set_title(title + ("\nred: pooled over seeds, 95% CI" if pooled else ""), fontsize=9)
    change.axhline(0.0, color="0.5", lw=0.8)
    for p in pooled or []:
        i, (lo, hi) = arms.index(p["arm"]), p["ci95"]
        change.errorbar(
            i + 0.25,
            p["mean"],
            yerr=[[p["mean"] - lo], [hi - p["mean"]]],
            fmt="D",
            color="C3",
            ms=4,
            capsize=3,
        )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
