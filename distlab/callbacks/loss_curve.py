"""Write a PNG of the training/validation curves from the CSV log at the end of fit (rank 0)."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only, rank_zero_warn

from distlab.domains import NonEmptyText, check_domains
from distlab.errors import ConfigError


def read_metrics(csv_path: str | Path) -> dict[str, list[tuple[int, float]]]:
    """{metric: [(step, value), ...]} from a Lightning CSVLogger metrics.csv."""
    series: dict[str, list[tuple[int, float]]] = {}
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            step = int(row.get("step") or 0)
            for key, value in row.items():
                if key in ("step", "epoch") or value in (None, ""):
                    continue
                series.setdefault(key, []).append((step, float(value)))
    return series


def plot_metrics(series: dict[str, list], out_png: str | Path, keys: tuple[str, ...] | None = None) -> Path:
    """Plot the named metrics of ``series`` (:func:`read_metrics`; default: train_loss and every val_* metric but
    timings): losses on the left, the other metrics (bits/byte, accuracy, ...) on the right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if keys is None:
        keys = tuple(
            k for k in series if k == "train_loss" or (k.startswith("val_") and not k.endswith("_time_s"))
        )
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for key in keys:
        if key not in series:
            continue
        steps, values = zip(*series[key], strict=True)
        ax = axes[0] if "loss" in key else axes[1]
        ax.plot(steps, values, label=key, marker="o" if key.startswith("val") else None, markersize=3)
    axes[0].set(xlabel="step", ylabel="loss", title="loss")
    axes[1].set(xlabel="step", title="validation metrics")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    out = Path(out_png)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


class LossCurvePlot(L.Callback):
    """At the end of fit, save ``loss_curve.png`` next to the CSV logger's metrics.csv (rank 0; no collectives).

    Args:
        keys: metrics to plot; default train_loss and every val_* metric but timings.
    """

    def __init__(self, keys: list[NonEmptyText] | None = None) -> None:
        check_domains(LossCurvePlot.__init__, locals())
        self.keys = tuple(keys) if keys else None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and not any(isinstance(lg, CSVLogger) for lg in trainer.loggers):
            raise ConfigError(
                "LossCurvePlot draws the CSV log, but no CSVLogger is configured (trainer.logger="
                f"{type(trainer.logger).__name__ if trainer.logger else 'false'}); add a CSVLogger to trainer.logger, "
                "or remove the callback"
            )

    @rank_zero_only
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        csv_logger = next(lg for lg in trainer.loggers if isinstance(lg, CSVLogger))  # setup made sure of one
        csv_logger.save()
        csv_path = Path(csv_logger.log_dir) / "metrics.csv"
        logged = read_metrics(csv_path) if csv_path.is_file() else {}
        missing = [k for k in self.keys or () if k not in logged]
        if missing:
            rank_zero_info(
                f"distlab: note: LossCurvePlot keys {missing} were never logged (logged: {sorted(logged) or 'nothing'}); "
                "they have no curve"
            )
        if not logged or (self.keys and len(missing) == len(self.keys)):
            return
        try:
            out = plot_metrics(logged, Path(csv_logger.log_dir) / "loss_curve.png", self.keys)
        except ImportError:
            rank_zero_warn("LossCurvePlot: matplotlib is not installed (pip install 'distlab[plots]')")
            return
        rank_zero_info(f"loss curve: {out}")
