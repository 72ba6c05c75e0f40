"""Every shipped config parses and runs; `--help`, `--print_config`, generate and config saving work."""

from __future__ import annotations

import sys

import pytest
import torch
import yaml

from distlab.cli import main
from tests.helpers.cli import CONFIGS, distlab_exe, run_subprocess

RECIPES = sorted(CONFIGS.glob("*.yaml"))
PRESETS = sorted((CONFIGS / "trainer").glob("*.yaml"))


def test_configs_folder_is_not_empty():
    assert {p.name for p in RECIPES} >= {"demo_cpu.yaml", "debug.yaml"}
    assert {p.name for p in PRESETS} >= {"cpu.yaml", "ddp_spawn_cpu.yaml"}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("config", RECIPES + PRESETS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_config_runs_fast_dev_run(config, tmp_path):
    trainer = (yaml.safe_load(config.read_text()) or {}).get("trainer", {})
    if trainer.get("accelerator") == "gpu" and not torch.cuda.is_available():
        pytest.skip(f"{config.name} needs a CUDA GPU")
    # Recipes run as shipped; trainer presets run on top of the debug recipe they are meant to compose with.
    base = [] if config.parent == CONFIGS else ["--config", str(CONFIGS / "debug.yaml")]
    main(
        [
            "fit",
            *base,
            "--config",
            str(config),
            "--trainer.fast_dev_run=2",
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.enable_progress_bar=false",
        ]
    )


def test_help_lists_subcommands_and_model_options():
    out = run_subprocess([*distlab_exe(), "--help"], timeout=120)
    assert out.returncode == 0, out.stderr
    assert "fit" in out.stdout and "validate" in out.stdout
    out = run_subprocess([sys.executable, "-m", "distlab", "fit", "--help"], timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--model.help" in out.stdout and "--data.help" in out.stdout  # any LightningModule / DataModule
    # The default classes' arguments and docstrings become --help text.
    out = run_subprocess(
        [sys.executable, "-m", "distlab", "fit", "--model.help", "distlab.modules.GPTLightningModule"], timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "--model.depth" in out.stdout and "the one size knob" in out.stdout
    out = run_subprocess([sys.executable, "-m", "distlab", "fit", "--data.help", "distlab.data.TextDataModule"], timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--data.seq_len" in out.stdout


def test_print_config_composes_configs(capsys):
    with pytest.raises(SystemExit) as info:
        main(
            [
                "fit",
                "--config",
                str(CONFIGS / "debug.yaml"),
                "--config",
                str(CONFIGS / "trainer" / "ddp_spawn_cpu.yaml"),
                "--print_config",
            ]
        )
    assert info.value.code == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["trainer"]["strategy"] == "ddp_spawn" and cfg["trainer"]["devices"] == 2
    assert cfg["model"]["init_args"]["depth"] == 1  # from debug.yaml, not overwritten by the preset


@pytest.mark.timeout(240)
def test_fit_saves_resolved_config_reruns_then_generate(tmp_path, capsys):
    args = [
        "fit",
        "--config",
        str(CONFIGS / "debug.yaml"),
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.max_steps=4",
    ]
    main(args)
    ckpts = sorted((tmp_path / "checkpoints").glob("*.ckpt"))
    assert ckpts, "fit wrote no checkpoint"
    # A fresh rerun into the same folder would mix runs (Lightning would write last-v1.ckpt beside the
    # old last.ckpt): refused in one line. Resuming there is the way, and the saved config is overwritten.
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    assert "already holds checkpoints of an earlier run" in capsys.readouterr().err
    main([*args[:-1], "--trainer.max_steps=6", f"--ckpt_path={ckpts[-1]}"])
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved["trainer"]["max_steps"] == 6 and saved["model"]["init_args"]["depth"] == 1
    ckpts = sorted((tmp_path / "checkpoints").glob("*.ckpt"))
    capsys.readouterr()
    main(["generate", "--ckpt_path", str(ckpts[-1]), "--prompt", "import ", "--max_new_tokens", "40"])
    text = capsys.readouterr().out
    assert text.startswith("import ") and len(text.encode()) > len("import ")
