"""Which way a metric improves, read from its name, whether a callback's ``mode`` goes against it, and whether a
monitor will ever see its metric (:func:`check_monitors_see_validation`).

``EarlyStopping(monitor="val_loss", mode="max")`` waits for the loss to rise and runs to the end without a word;
:func:`mode_against_the_metric` gives the one-line note SyncEarlyStopping prints::

    mode_against_the_metric("SyncEarlyStopping", "val_acc", "min")
    # "SyncEarlyStopping(monitor='val_acc', mode='min') takes the lowest val_acc ... set mode='max'"
"""

from __future__ import annotations

import re
from typing import Any

from distlab.errors import ConfigError

# name parts (split at anything not a letter or digit) that say which way the metric is better
LOWER_IS_BETTER = {
    "loss",
    "bpb",
    "ppl",
    "perplexity",
    "error",
    "err",
    "mse",
    "mae",
    "rmse",
    "nll",
    "wer",
    "cer",
}
HIGHER_IS_BETTER = {
    "acc",
    "accuracy",
    "f1",
    "auroc",
    "auc",
    "precision",
    "recall",
    "iou",
    "bleu",
    "rouge",
    "top1",
    "top5",
}


def mode_against_the_metric(who: str, monitor: object, mode: object) -> str | None:
    """The note for ``who(monitor=..., mode=...)`` whose mode goes against the way the metric improves, or None."""
    if not isinstance(monitor, str) or mode not in ("min", "max"):
        return None
    parts = set(re.split(r"[^a-z0-9]+", monitor.lower()))  # which way its name says it improves (else None)
    low, high = bool(parts & LOWER_IS_BETTER), bool(parts & HIGHER_IS_BETTER)
    better = "min" if low and not high else "max" if high and not low else None
    if better is None or better == mode:
        return None
    wants = "the lowest" if mode == "min" else "the highest"
    return (
        f"{who}(monitor={monitor!r}, mode={mode!r}) takes {wants} {monitor} as the best, but {monitor} improves as it "
        f"{'falls' if better == 'min' else 'rises'}: set mode={better!r}"
    )


def check_monitors_see_validation(trainer: Any, why_not: str) -> None:
    """Refuse (one line) a fit in which a callback watches a validation metric that no validation will produce
    (``why_not`` says why none runs): its best checkpoint or early stop would never come, without a word. A monitor
    told to tolerate a missing metric (``strict=False``) is left alone."""
    watching = [
        f"{type(cb).__name__}(monitor={cb.monitor!r})"
        for cb in trainer.callbacks
        if getattr(cb, "monitor", None) and getattr(cb, "strict", True)
    ]
    if watching:
        raise ConfigError(
            f"{why_not}, but {watching[0]} watches a metric validation would report, and would never see it (no "
            "best checkpoint, no early stop); validate (remove the setting), or remove the monitor"
        )
