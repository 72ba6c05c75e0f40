"""Which way a metric improves, read from its name, and whether a callback's ``mode`` goes against it.

``ModelCheckpoint(monitor="val_acc")`` keeps the *lowest* accuracies (its mode defaults to "min") and
``EarlyStopping(monitor="val_loss", mode="max")`` waits for the loss to rise: both run to the end without a word.
:func:`mode_against_the_metric` gives the one-line note both the CLI (for any callback named in a config, Lightning's
or the user's, that takes ``monitor`` and ``mode``) and distlab's own callbacks (from Python) print::

    mode_against_the_metric("ModelCheckpoint", "val_acc", "min")
    # "ModelCheckpoint(monitor='val_acc', mode='min') keeps ... set mode='max'"
"""

from __future__ import annotations

import re

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


def better_direction(metric: str) -> str | None:
    """ "min" or "max" where the metric's name says which way it improves, else None (a name of the user's own)."""
    parts = set(re.split(r"[^a-z0-9]+", metric.lower()))
    low, high = bool(parts & LOWER_IS_BETTER), bool(parts & HIGHER_IS_BETTER)
    return "min" if low and not high else "max" if high and not low else None


def mode_against_the_metric(who: str, monitor: object, mode: object) -> str | None:
    """The note for ``who(monitor=..., mode=...)`` whose mode goes against the way the metric improves, or None."""
    if not isinstance(monitor, str) or mode not in ("min", "max"):
        return None
    better = better_direction(monitor)
    if better is None or better == mode:
        return None
    wants = "the lowest" if mode == "min" else "the highest"
    return (
        f"{who}(monitor={monitor!r}, mode={mode!r}) takes {wants} {monitor} as the best, but {monitor} improves as it "
        f"{'falls' if better == 'min' else 'rises'}: set mode={better!r}"
    )
