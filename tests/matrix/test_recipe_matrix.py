"""Every shipped recipe x every CPU trainer preset: fit, then validate (and in some cells test) on the fit's
checkpoint.

New files in configs/ and configs/trainer/ join the matrix by themselves (a recipe whose structure another one has
already, differing in sizes only, is not run twice). Each combination is shrunk
(a few steps; the GPT recipes to a depth-1 model) and must

- fit to the end (no abort, no hang: FSDP2 + SampleText once aborted here),
- report validation metrics at its last step, and
- report, under ``distlab validate`` with the checkpoint, the very numbers the fit reported at that step
  (a recipe that switches Lightning's validation off once made ``validate`` report nothing, silently).

``distlab test`` runs the same evaluation through the test loop; it is checked in the cells ``TEST_CELLS``
pairs up so that every recipe and every preset is tested once (each launch costs a spawn of its ranks).
"""

from __future__ import annotations

import csv
import logging
import math
from pathlib import Path

import pytest
import torch
import yaml

from distlab.cli import main
from tests.helpers.cli import CONFIGS
from tests.helpers.tiny import SHRINK, model_class

SIZES_ONLY = ("default_root_dir", "prompt")  # keys that name a place or a text, not a structure


def structure(node):
    """A recipe with its numbers (and places, prompts) left out: classes, callbacks, flags and names. Two recipes
    of one structure differ in sizes only, which the matrix shrinks away."""
    if isinstance(node, dict):
        return tuple(sorted((k, structure(v)) for k, v in node.items() if k not in SIZES_ONLY))
    if isinstance(node, list):
        return tuple(structure(v) for v in node)
    return type(node).__name__ if isinstance(node, (int, float)) and not isinstance(node, bool) else node


# every recipe structure once (configs/stdlib_cpu_long.yaml is configs/demo_cpu.yaml longer and wider)
RECIPES = list(
    {
        structure(yaml.safe_load(p.read_text())): p for p in sorted(CONFIGS.glob("*.yaml"), reverse=True)
    }.values()
)
RECIPES.sort()
PRESETS = sorted(
    p
    for p in (CONFIGS / "trainer").glob("*.yaml")
    if (yaml.safe_load(p.read_text()) or {}).get("trainer", {}).get("accelerator") != "gpu"
)
STEPS = 4
TEST_CELLS = {
    (RECIPES[i % len(RECIPES)], PRESETS[i % len(PRESETS)]) for i in range(max(len(RECIPES), len(PRESETS)))
}


def read_last_metrics(csv_path: Path, prefix: str) -> dict[str, float]:
    """The last value of each ``prefix``* column (timings excluded) in a CSVLogger metrics.csv."""
    out: dict[str, float] = {}
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            for k, v in row.items():
                if k.startswith(prefix) and not k.endswith("_time_s") and v not in ("", None):
                    out[k] = float(v)
    return out


def rank_zero_validation_mode(recipe: Path) -> str | None:
    """The mode of the RankZeroValidation a recipe configures, or None."""
    for spec in (yaml.safe_load(recipe.read_text()).get("trainer") or {}).get("callbacks") or []:
        if spec.get("class_path", "").endswith("RankZeroValidation"):
            return (spec.get("init_args") or {}).get("mode", "auto")
    return None


def newest_checkpoint(root: Path) -> Path:
    ckpts = sorted((root / "checkpoints").glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    assert ckpts, f"the fit wrote no checkpoint under {root}"
    last = root / "checkpoints" / "last.ckpt"
    return last if last.exists() else ckpts[-1]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_with_preset_fits_validates_and_tests(recipe, preset, tmp_path, capfd, caplog):
    base = ["--config", str(recipe), "--config", str(preset), f"--trainer.default_root_dir={tmp_path}"]
    base += ["--trainer.enable_progress_bar=false", *SHRINK.get(model_class(recipe), [])]
    with caplog.at_level(
        logging.INFO
    ):  # (one process: logged here; spawned ranks: printed on the inherited fds)
        main(["fit", *base, f"--trainer.max_steps={STEPS}"])
    fit_metrics = read_last_metrics(tmp_path / "metrics.csv", "val_")
    assert fit_metrics, f"{recipe.name} + {preset.name}: the fit reported no validation metrics"
    said = capfd.readouterr()
    if rank_zero_validation_mode(recipe) == "auto":  # the line names the mode that ran (sharded: distributed)
        ran = "distributed" if "fsdp2" in preset.stem else "rank_zero"
        text = said.out + said.err + caplog.text
        assert f"({ran} validation of" in text, text[-2000:]

    ckpt = newest_checkpoint(tmp_path)
    assert torch.load(ckpt / "meta.pt" if ckpt.is_dir() else ckpt, weights_only=True)["global_step"] == STEPS
    checks = (
        (("validate", "val_"), ("test", "test_"))
        if (recipe, preset) in TEST_CELLS
        else (("validate", "val_"),)
    )
    for subcommand, prefix in checks:
        main([subcommand, *base, f"--ckpt_path={ckpt}"])
        got = read_last_metrics(
            tmp_path / subcommand / ckpt.name.removesuffix(".ckpt") / "metrics.csv", prefix
        )
        expected = {prefix + k.removeprefix("val_"): v for k, v in fit_metrics.items()}
        assert set(got) == set(expected), (subcommand, got, expected)
        for k, v in expected.items():
            assert math.isclose(got[k], v, rel_tol=1e-5, abs_tol=1e-6), (subcommand, k, got[k], v)
