"""Every shipped config parses and runs; `--help`, `--print_config`, generate and config saving work."""

from __future__ import annotations

import os

import pytest
import yaml

from distlab.cli import main
from tests.helpers.cli import CONFIGS, distlab_exe, run_subprocess

RECIPES = sorted(CONFIGS.glob("*.yaml"))
PRESETS = sorted((CONFIGS / "trainer").glob("*.yaml"))


def test_configs_folder_is_not_empty():
    assert {p.name for p in RECIPES} >= {"demo_cpu.yaml", "debug.yaml"}
    assert {p.name for p in PRESETS} >= {"cpu.yaml", "ddp_spawn_cpu.yaml"}


# Every recipe x every CPU preset runs fit/validate/test in tests/matrix/test_recipe_matrix.py.
@pytest.mark.parametrize("config", PRESETS, ids=lambda p: p.stem)
def test_every_preset_composes_with_a_recipe(config, capsys):
    """GPU presets cannot run here, but each one (like every preset) must parse on top of a recipe."""
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", str(CONFIGS / "debug.yaml"), "--config", str(config), "--print_config"])
    assert info.value.code == 0
    trainer = yaml.safe_load(capsys.readouterr().out)["trainer"]
    assert trainer["max_steps"] == 8  # the recipe's, not replaced by the preset
    for key, value in (yaml.safe_load(config.read_text()).get("trainer") or {}).items():
        if isinstance(value, dict):  # a class: its given init_args, among the defaults filled in
            assert trainer[key]["class_path"] == value["class_path"], key
            assert trainer[key]["init_args"].items() >= value.get("init_args", {}).items(), key
        else:
            assert trainer[key] == value, key


def test_help_lists_subcommands_and_model_options(capsys):
    from distlab.cli.commands import FUNCTION_COMMANDS

    out = run_subprocess([*distlab_exe(), "--help"], timeout=120)  # the installed console script
    assert out.returncode == 0, out.stderr
    assert "fit" in out.stdout and "validate" in out.stdout
    # every subcommand is declared: distlab --help names them all, and each has its own --help
    assert "{" + ",".join(["fit", "validate", "test", "predict", *FUNCTION_COMMANDS]) + "}" in out.stdout, (
        out.stdout[:500]
    )

    def help_of(*args: str, command: str = "fit") -> str:
        with pytest.raises(SystemExit) as info:
            main([command, *args])
        assert info.value.code == 0
        return capsys.readouterr().out

    for sub in FUNCTION_COMMANDS:
        assert f"usage: distlab {sub}" in help_of("--help", command=sub)

    assert "--model.help" in help_of("--help") and "--data.help" in help_of("--help")  # any module / data
    # The default classes' arguments and docstrings become --help text.
    gpt = help_of("--model.help", "distlab.modules.GPTLightningModule")
    assert "--model.depth" in gpt and "the one size knob" in gpt
    assert "--data.seq_len" in help_of("--data.help", "distlab.data.TextDataModule")


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


def print_config(capsys, args: list[str]) -> dict:
    with pytest.raises(SystemExit) as info:
        main([*args, "--print_config"])
    assert info.value.code == 0
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize(
    "choice",
    [["--model", "GPTLightningModule"], ["--model=distlab.modules.GPTLightningModule"]],
    ids=["short name", "import path"],
)
def test_a_class_named_after_a_recipe_gets_the_recipes_values(capsys, choice):
    """``--config recipe.yaml --model X``: the recipe's model values apply to X, whatever the order typed."""
    recipe = ["--config", str(CONFIGS / "debug.yaml")]
    for args in (["fit", *recipe, *choice, "--model.depth=2"], ["fit", *choice, *recipe, "--model.depth=2"]):
        model = print_config(capsys, args)["model"]
        assert model["class_path"] == "distlab.modules.GPTLightningModule", args
        assert model["init_args"]["depth"] == 2 and model["init_args"]["sequence_len"] == 32, args


def test_a_class_named_in_a_config_keeps_the_typed_order(capsys, tmp_path):
    """When a config file names the class, the command line is read in the order typed: the last class wins."""
    other = tmp_path / "digits.yaml"
    other.write_text("model:\n  class_path: distlab.modules.ImageClassifier\n")
    args = ["fit", "--config", str(CONFIGS / "digits_cpu.yaml"), "--model", "GPTLightningModule"]
    assert print_config(capsys, args)["model"]["class_path"] == "distlab.modules.GPTLightningModule"
    args = ["fit", "--model", "GPTLightningModule", "--config", str(other)]
    assert print_config(capsys, args)["model"]["class_path"] == "distlab.modules.ImageClassifier"


def test_classes_first_moves_only_a_single_class_choice(tmp_path):
    from distlab.cli.argv import classes_first

    recipe = str(CONFIGS / "debug.yaml")  # model values, no class
    named = tmp_path / "named.yaml"
    named.write_text("model: GPTLightningModule\n")  # a class as a plain string
    top = tmp_path / "top.yaml"
    top.write_text("fit: {}\n")
    cases = [
        (["fit", "-c", recipe, "--model", "A"], ["fit", "--model", "A", "-c", recipe]),
        (["--config", str(top), "fit", "-c", recipe, "--model=A"], ["--config", str(top), "fit", "--model=A", "-c", recipe]),
        (["fit", "--model", "A", "-c", recipe, "--model", "B"], None),  # two choices: the typed order decides
        (["fit", "-c", str(named), "--model", "A"], None),  # a config names a class (as a string)
        (["fit", "-c", recipe, "--model.help", "A"], None),  # not a choice
        (["fit", "-c", recipe, "--model.depth=3", "--data", "D"], ["fit", "--data", "D", "-c", recipe, "--model.depth=3"]),
    ]  # fmt: skip
    for argv, want in cases:
        assert classes_first(argv) == (argv if want is None else want), argv


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
    assert "already holds an earlier run" in capsys.readouterr().err
    main([*args[:-1], "--trainer.max_steps=6", f"--ckpt_path={ckpts[-1]}"])
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved["trainer"]["max_steps"] == 6 and saved["model"]["init_args"]["depth"] == 1
    ckpts = sorted((tmp_path / "checkpoints").glob("*.ckpt"))
    capsys.readouterr()
    main(["generate", "--ckpt_path", str(ckpts[-1]), "--prompt", "import ", "--max_new_tokens", "40"])
    text = capsys.readouterr().out
    assert text.startswith("import ") and len(text.encode()) > len("import ")


def test_a_run_leaves_no_launch_environment_behind(tmp_path, monkeypatch):
    """Lightning's DDP set-up writes LOCAL_RANK / MASTER_PORT / ... into os.environ; a second run in the same
    process (a notebook, a test) then believed an external launcher had started it and waited forever for a
    rank nobody launched. distlab's main() puts the launch environment back as it found it."""
    from distlab.cli import LAUNCH_ENV

    for key in LAUNCH_ENV:
        monkeypatch.delenv(key, raising=False)
    main(
        [
            "fit",
            "--config",
            str(CONFIGS / "debug.yaml"),
            "--config",
            str(CONFIGS / "trainer" / "torchrun.yaml"),  # ddp_optimizer_sync: Lightning's subprocess launcher
            "--trainer.max_steps=1",
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.enable_progress_bar=false",
        ]
    )
    assert not {k for k in LAUNCH_ENV if k in os.environ}


@pytest.mark.parametrize("where", ["command line", "config file"])
@pytest.mark.parametrize("form", ["strategy", "strategy with an option"])
def test_a_strategy_named_by_its_class_path_is_that_class(where, form, tmp_path):
    """`--trainer.strategy=distlab.strategies.OptimizerSyncDDPStrategy` (a class, as --help lists them) is the class,
    with options after it or not (jsonargparse took the bare path as a strategy *name*, which Lightning refused)."""
    from distlab.cli import run_cli
    from distlab.strategies import OptimizerSyncDDPStrategy

    path = "distlab.strategies.OptimizerSyncDDPStrategy"
    options = ["--trainer.strategy.timeout=0:05:00"] if form == "strategy with an option" else []
    if where == "command line":
        given = [f"--trainer.strategy={path}", *options]
    else:
        given = ["--config", str(tmp_path / "s.yaml"), *options]
        (tmp_path / "s.yaml").write_text(yaml.safe_dump({"trainer": {"strategy": path}}))
    cli = run_cli(
        [
            "fit",
            "--config",
            str(CONFIGS / "debug.yaml"),
            *given,
            "--trainer.max_steps=1",
            f"--trainer.default_root_dir={tmp_path / 'run'}",
        ]
    )
    assert type(cli.trainer.strategy) is OptimizerSyncDDPStrategy
    assert cli.trainer.global_step == 1


def test_seed_everything_true_picks_a_seed_that_config_yaml_records(tmp_path, monkeypatch):
    """`--seed_everything=true` (the help says: picks one at random) was Lightning's seed 0 in every run: two fits
    pick different seeds, each recorded in its config.yaml; the processes of one launched job agree on theirs."""
    from distlab.cli import main
    from distlab.cli.app import random_seed

    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    seeds = []
    for name in ("a", "b"):
        run = tmp_path / name
        main(
            [
                "fit",
                "--config",
                str(CONFIGS / "debug.yaml"),
                f"--trainer.default_root_dir={run}",
                "--trainer.max_steps=1",
                "--seed_everything=true",
            ]
        )
        recorded = yaml.safe_load((run / "config.yaml").read_text())["seed_everything"]
        assert isinstance(recorded, int) and not isinstance(recorded, bool)
        seeds.append(recorded)
        monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)  # seed_everything exported it for spawned ranks
    assert seeds[0] != seeds[1]
    job = {"TORCHELASTIC_RUN_ID": "4e1d"}
    assert random_seed(job) == random_seed(dict(job)) and 0 <= random_seed(job) < 2**32
    assert random_seed({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}) != random_seed(
        {"SLURM_JOB_ID": "8", "SLURM_STEP_ID": "0"}
    )
    assert random_seed({"PL_GLOBAL_SEED": "123", **job}) == 123


def test_a_class_file_given_to_model_applies_where_it_is_written(capsys, tmp_path):
    """``--model model.yaml`` (class_path + init_args, as LightningCLI reads it): its class is chosen, and its
    init_args override the recipe's when written after it and are overridden when written before it."""
    file = tmp_path / "model.yaml"
    file.write_text("class_path: distlab.modules.GPTLightningModule\ninit_args: {depth: 3, head_dim: 8}\n")
    debug = ["--config", str(CONFIGS / "debug.yaml")]
    after = print_config(capsys, ["fit", *debug, "--model", str(file)])["model"]
    assert after["class_path"] == "distlab.modules.GPTLightningModule"
    assert (after["init_args"]["depth"], after["init_args"]["head_dim"]) == (3, 8)
    assert after["init_args"]["aspect_ratio"] == 32  # the recipe's, untouched by the file
    before = print_config(capsys, ["fit", "--model", str(file), *debug])["model"]
    assert (before["init_args"]["depth"], before["init_args"]["head_dim"]) == (1, 16)  # the recipe wrote last
