"""Every shell command in README.md and docs/guide.md that runs on a CPU, run as written, in order (the
README's, then the guide's), in a tiny mode.

Tiny mode changes only sizes: a GPT recipe gets a depth-1 model (the recipe matrix's shrink flags),
and every step count (a recipe's ``max_steps``, ``--trainer.max_steps=N``, the step in
``DISTLAB_FAULT=kind:rank:step``) is divided by 100. Everything else (subcommands, presets, paths,
launchers, the order within a bash block) is the README's, so a command that no longer runs fails here. Blocks run
two at a time; a block that names a run folder or file an earlier block names waits for it. The commands run
in a scratch folder that links ``configs/``, ``scripts/`` and ``distlab/``, so ``runs/`` and exports land
there. A bash block is skipped only when a ``<!-- readme-test: skip (reason) -->`` line precedes it.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from distlab.log import MOOT_LOG_LINES, MOOT_WARNINGS, SYNC_DIST_ADVICE
from tests.helpers.cli import REPO, subprocess_env
from tests.helpers.tiny import SHRINK, model_class

SKIP = re.compile(r"<!-- readme-test: skip \((.+)\) -->")
RUNNERS = {"distlab", "python", "torchrun", "wait"}


def tiny_steps(n: int) -> int:
    return max(2, n // 100)


def readme_blocks(text: str) -> tuple[list[list[str]], list[str]]:
    """``(the commands of each ```bash block to run, skip reasons)``, continuation lines joined."""
    blocks, skipped = [], []
    for m in re.finditer(r"```bash\n(.*?)```", text, re.S):
        before = text[: m.start()].rstrip().splitlines()[-1]
        if reason := SKIP.search(before):
            skipped.append(reason.group(1))
            continue
        body = m.group(1).replace("\\\n", " ")
        blocks.append([line.strip() for line in body.splitlines() if line.strip()])
    return blocks, skipped


def tiny(command: str) -> tuple[list[str], bool]:
    """The command's words in tiny mode, and whether it runs in the background (``&``)."""
    words = shlex.split(command, comments=True)
    background = words[-1] == "&"
    words = words[:-1] if background else words
    for i, w in enumerate(words):
        if m := re.fullmatch(r"DISTLAB_FAULT=(\w+):(\d+):(\d+)", w):
            words[i] = f"DISTLAB_FAULT={m[1]}:{m[2]}:{max(1, int(m[3]) // 100)}"
        elif m := re.fullmatch(r"--trainer\.max_steps=(\d+)", w):
            words[i] = f"--trainer.max_steps={tiny_steps(int(m[1]))}"
    sub = next((w for w in words if w in ("fit", "validate", "test")), None)
    runs_distlab = words[0] == "distlab" or "distlab" in words  # the CLI, or `-m distlab` under torchrun
    if runs_distlab and sub and "--config" in words and not any("help" in w for w in words):
        recipe = Path(words[words.index("--config") + 1])
        words += SHRINK.get(model_class(REPO / recipe), [])
        if sub == "fit" and not any(w.startswith("--trainer.max_steps=") for w in words):
            steps = yaml.safe_load((REPO / recipe).read_text())["trainer"]["max_steps"]
            words.append(f"--trainer.max_steps={tiny_steps(steps)}")
    return words, background


DOCUMENTS = ("README.md", "docs/guide.md")


def documented_blocks() -> tuple[list[list[str]], list[str]]:
    """The README's bash blocks, then the guide's (which continues the README: it resumes the demo run)."""
    blocks: list[list[str]] = []
    skipped: list[str] = []
    for doc in DOCUMENTS:
        b, s = readme_blocks((REPO / doc).read_text())
        blocks, skipped = blocks + b, skipped + s
    return blocks, skipped


def documented_commands() -> tuple[list[str], list[str]]:
    blocks, skipped = documented_blocks()
    return [c for block in blocks for c in block], skipped


PLACE = re.compile(r"(?:runs|data_cache)/[\w.-]+|(?<![\w/.-])[\w.-]+\.(?:safetensors|ckpt)")


def places(block: list[str]) -> set[str]:
    """What a block's commands write or read: run folders, caches and files they name, and the run folder a
    recipe sets where a command that runs it (not one that prints its config or help) does not set one."""
    found: set[str] = set()
    for command in block:
        found |= set(PLACE.findall(command))
        words = shlex.split(command, comments=True)
        prints = any(w == "--print_config" or w.endswith("help") for w in words)
        if (
            "--config" in words
            and not prints
            and not any(w.startswith("--trainer.default_root_dir") for w in words)
        ):
            recipe = yaml.safe_load((REPO / words[words.index("--config") + 1]).read_text())
            found.add(recipe["trainer"].get("default_root_dir", "lightning_logs"))
    return found


def test_commands_are_found_and_tiny_mode_only_changes_sizes():
    commands, skipped = documented_commands()
    assert len(commands) >= 20 and len(skipped) >= 2, (commands, skipped)
    words, bg = tiny("DISTLAB_FAULT=crash:1:150 torchrun -m distlab fit --config configs/demo_cpu.yaml &")
    assert bg and words[0] == "DISTLAB_FAULT=crash:1:1" and "--trainer.max_steps=4" in words
    assert "--model.depth=1" in words
    words, _ = tiny("distlab fit --config configs/digits_cpu.yaml --trainer.max_steps=600  # a comment")
    assert words == ["distlab", "fit", "--config", "configs/digits_cpu.yaml", "--trainer.max_steps=6"]


@pytest.mark.timeout(1200)
def test_readme_cpu_commands_run_as_written(tmp_path):
    blocks, _ = documented_blocks()
    for name in ("configs", "scripts", "distlab"):
        (tmp_path / name).symlink_to(REPO / name)
    env = subprocess_env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"

    def check(command: str, rc: int, stderr: str) -> None:
        assert rc == 0, f"README command failed (exit {rc}): {command}\n{stderr[-3000:]}"
        assert "Traceback" not in stderr, f"{command}\n{stderr[-3000:]}"
        # Quiet logs: no advertising tips, no dependency deprecation noise, no sync_dist advice for values
        # RankZeroValidation computes exactly (tests/unit/test_quiet_logs.py shows DISTLAB_VERBOSE brings them back)
        for moot in (*MOOT_LOG_LINES, *MOOT_WARNINGS, SYNC_DIST_ADVICE):
            assert moot not in stderr, f"{command} printed {moot!r}:\n{stderr[-3000:]}"

    def run_block(block: list[str], after: list[Future]) -> None:
        """The block's commands one after another, as a reader runs them, once the blocks it follows are done."""
        for earlier in after:
            earlier.result()
        background: list[tuple[str, subprocess.Popen]] = []
        for command in block:
            words, in_background = tiny(command)
            assert words[0] in RUNNERS or "=" in words[0], f"README command of an unknown kind: {command}"
            if words == ["wait"]:
                for cmd, proc in background:
                    _, err = proc.communicate(timeout=300)
                    check(cmd, proc.returncode, err)
                background.clear()
                continue
            line = " ".join(shlex.quote(w) if "=" not in w or w.startswith("-") else w for w in words)
            if in_background:
                proc = subprocess.Popen(
                    ["bash", "-c", line],
                    cwd=tmp_path,
                    env=env,
                    text=True,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
                background.append((command, proc))
                continue
            out = subprocess.run(
                ["bash", "-c", line], cwd=tmp_path, env=env, text=True, capture_output=True, timeout=300
            )
            check(command, out.returncode, out.stderr)
        assert not background, "a README block starts a command with & but never waits for it"

    # Blocks run in order, two at a time: a block waits for every earlier block that names one of its places (the
    # guide's resume of runs/demo waits for the README's first block), so each sees what the text says it follows.
    with ThreadPoolExecutor(max_workers=2) as pool:
        done: list[tuple[set[str], Future]] = []
        for block in blocks:
            mine = places(block)
            after = [f for theirs, f in done if theirs & mine]
            done.append((mine, pool.submit(run_block, block, after)))
        for _, future in done:
            future.result()
    # What the tour promises exists: checkpoints, the exports, the profiler trace.
    assert (tmp_path / "runs/demo/checkpoints/last.ckpt").exists()
    assert (tmp_path / "demo.safetensors").stat().st_size > 0
    assert (tmp_path / "demo_fsdp2.safetensors").stat().st_size > 0
    assert list((tmp_path / "runs/profile").rglob("*.pt.trace.json"))


def test_every_runnable_command_the_readme_shows_is_run():
    """The README's launch table shows commands inline (no bash block); each one with no placeholder (``...``,
    ``$VAR``) and no GPU preset is run by this module: it begins a command of the README or the guide (which may add
    a run folder of its own)."""
    readme = (REPO / "README.md").read_text()
    shown = [
        c
        for c in re.findall(r"`((?:distlab|torchrun) [^`]+)`", readme)
        if not re.search(r"\.\.\.|\$|gpu|--help|CLASS|=N\b", c)  # placeholders, GPU presets, help
        and "my_classifier.py"
        not in c  # the README's own example: tests/unit/test_readme.py runs it under torchrun
    ]
    assert len(shown) >= 3, shown
    run = [shlex.split(c, comments=True) for c in documented_commands()[0]]
    for command in shown:
        words = shlex.split(command)
        assert any(r[: len(words)] == words for r in run), f"the README shows {command!r}, which no test runs"
