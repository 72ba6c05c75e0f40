"""Install distlab as users do, at the oldest and the newest versions its dependencies allow, and run a smoke set.

    python scripts/check_versions.py                 # both legs (~8 min on 2 cores, most of it installing)
    python scripts/check_versions.py --leg oldest    # or newest
    make test-versions

For each leg: a fresh virtual environment; the dependencies pinned to the lower bounds that pyproject.toml
declares (``oldest``) or resolved to the newest versions its ranges allow (``newest``); distlab's wheel, built
from this checkout and installed like any package (not editable). Then, from a folder outside the repository:

- the README's own-module example (a user's LightningModule on 2 spawned CPU ranks);
- ``distlab fit`` of the debug recipe under each CPU trainer preset (the recipes come from the installed package);
- a resume of that fit, and ``distlab validate`` on its checkpoint;
- ``distlab generate`` and ``distlab export`` of that checkpoint, ``distlab prepare`` of a file, and a bad value
  refused in one line (every subcommand's parser is built by the installed jsonargparse);
- ``import distlab`` refusing, in one line, a version outside the declared range, and the compromised lightning
  releases (2.6.2, 2.6.3) excluded by the wheel's ranges and refused by name before anything imports them.

The ranges are read from pyproject.toml, so what is declared is what runs. Prints one row per step and exits 1
if any failed. The wheel files and logs stay in --work (default: a temporary folder).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRESETS = ("cpu", "ddp_spawn_cpu", "ddp_optimizer_sync_spawn_cpu", "fsdp2_cpu")
FIND_LINKS = [p for p in ("/opt/wheels",) if Path(p).is_dir()]  # torch's CPU wheel on our machines


def declared() -> list[str]:
    """The runtime requirements in pyproject.toml, as written."""
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]


def oldest(requirement: str) -> str:
    """``name>=1.2,<2`` -> ``name==1.2`` (extras kept): the lower bound, which every range here has."""
    m = re.match(r"^([A-Za-z0-9_.-]+(?:\[[^\]]*\])?)\s*(.*)$", requirement)
    name, spec = m.group(1), m.group(2)
    low = re.search(r">=\s*([0-9][^,\s]*)", spec)
    if low is None:
        raise SystemExit(
            f"check_versions: {requirement!r} has no lower bound (>=); every dependency needs one"
        )
    return f"{name}=={low.group(1)}"


def run(cmd: list[str], cwd: Path, log: Path, timeout: float, env: dict | None = None) -> tuple[bool, float]:
    t0 = time.perf_counter()
    with log.open("a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        try:
            rc = subprocess.run(
                cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, env=env
            ).returncode
        except subprocess.TimeoutExpired:
            f.write(f"TIMEOUT after {timeout}s\n")
            rc = 124
    return rc == 0, time.perf_counter() - t0


def readme_example() -> str:
    text = (REPO / "README.md").read_text()
    after = text[text.index("<!-- example:user-module") :]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def leg(name: str, work: Path, wheel: Path) -> list[tuple[str, bool, float]]:
    venv, here, log = work / f"venv-{name}", work / f"run-{name}", work / f"{name}.log"
    shutil.rmtree(venv, ignore_errors=True)
    shutil.rmtree(here, ignore_errors=True)
    here.mkdir(parents=True)
    rows: list[tuple[str, bool, float]] = []
    ok, s = run([sys.executable, "-m", "venv", str(venv)], work, log, 300)
    py, distlab = str(venv / "bin" / "python"), str(venv / "bin" / "distlab")
    reqs = [oldest(r) for r in declared()] if name == "oldest" else declared()
    pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-q"]
    pip += [a for link in FIND_LINKS for a in ("--find-links", link)]
    ok, s = run([*pip, *reqs], work, log, 1800)
    rows.append((f"install {' '.join(reqs)}", ok, s))
    if not ok:
        return rows
    ok, s = run([*pip, "--no-deps", str(wheel)], work, log, 600)
    rows.append(("install distlab wheel (not editable)", ok, s))
    freeze = subprocess.run([py, "-m", "pip", "freeze"], capture_output=True, text=True).stdout
    versions = {ln.split("==")[0].lower(): ln.split("==")[1] for ln in freeze.splitlines() if "==" in ln}
    shown = ", ".join(
        f"{k} {versions.get(k, '?')}" for k in ("torch", "lightning", "torchmetrics", "jsonargparse")
    )
    rows.append((f"versions: {shown}", True, 0.0))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "TORCHELASTIC", "PYTHONPATH"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH="")
    (here / "example.py").write_text(readme_example())
    rows.append(("README own-module example, 2 spawned ranks", *run([py, "example.py"], here, log, 600, env)))
    tiny = ["--trainer.max_steps=4", "--trainer.val_check_interval=2"]
    for preset in PRESETS:
        cmd = [distlab, "fit", "--config", "configs/debug.yaml", "--config", f"configs/trainer/{preset}.yaml"]
        rows.append(
            (
                f"distlab fit debug x {preset}",
                *run([*cmd, f"--trainer.default_root_dir=r-{preset}", *tiny], here, log, 600, env),
            )
        )
    ckpts = sorted((here / "r-cpu" / "checkpoints").glob("*.ckpt"))
    ckpt = str(ckpts[-1]) if ckpts else "missing.ckpt"
    resume = [distlab, "fit", "--config", "configs/debug.yaml", "--trainer.default_root_dir=r-cpu"]
    rows.append(
        (
            "resume to step 6",
            *run([*resume, "--trainer.max_steps=6", f"--ckpt_path={ckpt}"], here, log, 600, env),
        )
    )
    validate = [distlab, "validate", "--config", "configs/debug.yaml", "--trainer.default_root_dir=r-cpu"]
    rows.append(("validate the checkpoint", *run([*validate, f"--ckpt_path={ckpt}"], here, log, 600, env)))
    # every subcommand's parser is built at these versions, and a list option given as words
    rows.append(
        (
            "generate from the checkpoint",
            *run([distlab, "generate", f"--ckpt_path={ckpt}", "--max_new_tokens=8"], here, log, 300, env),
        )
    )
    rows.append(
        (
            "export it",
            *run([distlab, "export", f"--ckpt_path={ckpt}", "--out=model.safetensors"], here, log, 300, env),
        )
    )
    (here / "text.txt").write_text("def f(x):\n    return x\n" * 400)  # one file: split by position
    prepare = [distlab, "prepare", "--out=prepared", "--paths", "text.txt", "--extensions", ".txt", ".py"]
    rows.append(("prepare a file (list options given as words)", *run(prepare, here, log, 300, env)))
    bad = subprocess.run(
        [
            distlab,
            "fit",
            "--config",
            "configs/debug.yaml",
            "--model.weight_decay=-1",
            "--trainer.default_root_dir=r-bad",
        ],
        capture_output=True,
        text=True,
        cwd=here,
        env=env,
        timeout=300,
    )
    one_line = (
        bad.returncode == 2 and bad.stderr.count("distlab: error:") == 1 and "Traceback" not in bad.stderr
    )
    rows.append(
        (
            "a value outside its domain refused in one line, exit 2",
            one_line and not (here / "r-bad").exists(),
            0.0,
        )
    )
    refuse = "import distlab.versions as c; c.check_versions({'lightning': '>=99'})"
    out = subprocess.run([py, "-c", refuse], capture_output=True, text=True, cwd=here, env=env)
    said = out.returncode != 0 and "lightning" in out.stderr and "supported: lightning>=99" in out.stderr
    rows.append(("an untested version is refused at import", said, 0.0))
    rows.append(
        ("the compromised lightning releases are refused at import", compromised_refused(py, here, env), 0.0)
    )
    return rows


def compromised_refused(py: str, here: Path, env: dict) -> bool:
    """lightning / pytorch-lightning 2.6.2 and 2.6.3 (GHSA-w37p-236h-pfx3): the installed wheel's declared ranges
    admit neither, and a planted stand-in of each (whose import writes a file) is refused by ``import distlab`` in
    one line, with DISTLAB_ALLOW_UNTESTED=1, before anything imports it."""
    from packaging.requirements import Requirement

    ask = "import importlib.metadata as m; print('\\n'.join(m.requires('distlab')))"
    requires = subprocess.run([py, "-c", ask], capture_output=True, text=True, env=env).stdout.split("\n")
    declared = {r.name: r.specifier for r in map(Requirement, filter(None, requires)) if r.marker is None}
    ok = True
    for name in ("lightning", "pytorch-lightning"):
        for version in ("2.6.2", "2.6.3"):
            ok &= name in declared and not declared[name].contains(version)
            site, marker = here / f"planted-{name}-{version}", here / f"payload-{name}-{version}"
            info = site / f"{name.replace('-', '_')}-{version}.dist-info"
            info.mkdir(parents=True, exist_ok=True)
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
            (site / name.replace("-", "_")).mkdir(exist_ok=True)
            (site / name.replace("-", "_") / "__init__.py").write_text(f"open({str(marker)!r}, 'w')\n")
            planted = {**env, "PYTHONPATH": str(site), "DISTLAB_ALLOW_UNTESTED": "1"}
            out = subprocess.run(
                [py, "-c", "import distlab"], capture_output=True, text=True, env=planted, cwd=here
            )
            said = out.stderr.strip().splitlines()[-1:] or [""]
            ok &= out.returncode != 0 and not marker.exists() and "GHSA-w37p-236h-pfx3" in said[0]
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--leg", choices=("oldest", "newest", "both"), default="both")
    parser.add_argument(
        "--work", type=Path, default=None, help="where venvs, runs and logs go (default: a temp dir)"
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep each leg's venv (several GB) and run folder; logs are always kept",
    )
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="distlab-versions-"))
    work.mkdir(parents=True, exist_ok=True)
    wheels = work / "wheel"
    shutil.rmtree(wheels, ignore_errors=True)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)],
        capture_output=True,
        text=True,
    )
    if built.returncode != 0:
        raise SystemExit(f"check_versions: building the wheel failed:\n{built.stderr[-2000:]}")
    wheel = next(wheels.glob("distlab-*.whl"))
    failed = 0
    for name in ("oldest", "newest") if args.leg == "both" else (args.leg,):
        print(f"== {name} (log: {work / (name + '.log')})", flush=True)
        for what, ok, seconds in leg(name, work, wheel):
            failed += not ok
            print(f"  {'ok  ' if ok else 'FAIL'} {seconds:6.1f}s  {what}", flush=True)
        if not args.keep:  # a venv is several GB: repeated runs must not fill the disk
            for made in (work / f"venv-{name}", work / f"run-{name}"):
                shutil.rmtree(made, ignore_errors=True)
    shutil.rmtree(wheels, ignore_errors=True)
    print(
        "check_versions: all passed" if not failed else f"check_versions: {failed} step(s) failed", flush=True
    )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
