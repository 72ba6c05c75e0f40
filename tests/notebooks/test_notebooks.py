"""Every notebook in notebooks/ executes top to bottom (nbclient, fresh kernel, cwd = repo root) and prints
what it claims; each notebook's printed numbers are checked here too, not only by the notebook's own asserts.

The notebooks are stored without outputs (checked below), so a diff shows only what a person changed.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from tests.helpers.cli import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def execute(nb: nbformat.NotebookNode) -> tuple[str, float]:
    """Runs ``nb`` in place in a fresh python3 kernel; returns (its stdout, seconds)."""
    start = time.perf_counter()
    NotebookClient(
        nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
    ).execute()
    seconds = time.perf_counter() - start
    return stdout_of(nb), seconds


def stdout_of(nb: nbformat.NotebookNode) -> str:
    return "\n".join(
        o.get("text", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "stream" and o.get("name") == "stdout"
    )


# ---- what each notebook must print ------------------------------------------------------------------


def check_quickstart(text: str, nb: nbformat.NotebookNode) -> None:
    # Both optimizers trained: far below the 8.0 bits/byte of a uniform guess over 256 bytes.
    found = re.search(r"final val bits/byte\s+muon\+adamw: ([\d.]+)\s+adamw: ([\d.]+)", text)
    assert found, text[-2000:]
    muon, adamw = float(found.group(1)), float(found.group(2))
    assert 0 < muon < 5 and 0 < adamw < 6, (muon, adamw)
    # The sample continues the prompt with 120 bytes of its own.
    sample = next(line for line in text.splitlines() if line.startswith("def "))
    assert len(text.split("def ", 1)[1]) >= 100, sample


RANK_LINE = re.compile(
    r"^rank (\d+) of (\d+): start step (\d+), end step (\d+), (\d+) params, sum (\S+), sha256 ([0-9a-f]{16})$",
    re.M,
)


def check_distributed_cpu(text: str, nb: nbformat.NotebookNode) -> None:
    reports = [
        dict(zip(("rank", "world", "start", "end", "n", "sum", "sha"), m, strict=True))
        for m in RANK_LINE.findall(text)
    ]
    assert len(reports) == 4, f"expected 2 ranks x (fit, resume), got {reports}\n{text[-3000:]}"
    fit, resumed = reports[:2], reports[2:]
    for run in (fit, resumed):
        # a. the parameters are identical on both ranks (same float64 sum, same SHA-256 of the bytes)
        assert [r["rank"] for r in run] == ["0", "1"] and {r["world"] for r in run} == {"2"}, run
        assert run[0]["sha"] == run[1]["sha"] and run[0]["sum"] == run[1]["sum"], run
        assert run[0]["n"] == run[1]["n"] and int(run[0]["n"]) > 0, run
        assert run[0]["end"] == run[1]["end"], run
    assert fit[0]["sha"] != resumed[0]["sha"], "the resumed run did not change the weights"

    # b. rank-0 validation during the 2-rank fit == 1-process `distlab validate` of last.ckpt
    vals = re.findall(
        r"^(val_\w+): fit \(rank 0 of 2\) ([\d.]+)\s+validate \(1 process\) ([\d.]+)", text, re.M
    )
    assert {name for name, _, _ in vals} == {"val_loss", "val_ppl", "val_bpb"}, vals
    for name, two, one in vals:
        assert abs(float(two) - float(one)) <= 1e-6 * max(1.0, abs(float(one))), (name, two, one)
        assert 0 < float(one) < 100, (name, one)

    # c. early stopping: both ranks stopped at the same step, the second validation (every 4 steps)
    stop = re.search(
        r"^early stop: rank 0 stopped at step (\d+), rank 1 at step (\d+) \(max_steps (\d+)\)", text, re.M
    )
    assert stop, text[-3000:]
    s0, s1, max_steps = map(int, stop.groups())
    assert s0 == s1 == 8 < max_steps, (s0, s1, max_steps)
    assert int(fit[0]["start"]) == 0 and int(fit[0]["end"]) == s0, fit
    ckpt = re.search(r"last\.ckpt holds step (\d+)$", text, re.M)
    assert ckpt and int(ckpt.group(1)) == s0, ckpt

    # d. the resume started from the saved step on both ranks and ended at the new max_steps
    starts = re.findall(r"^resume: rank (\d) started at step (\d+), ended at step (\d+)$", text, re.M)
    assert [r for r, _, _ in starts] == ["0", "1"], starts
    new_max = int(starts[0][2])
    assert new_max > s0 and all(int(a) == s0 and int(b) == new_max for _, a, b in starts), starts
    assert all(int(r["start"]) == s0 and int(r["end"]) == new_max for r in resumed), resumed
    logged = re.search(
        r"^metrics\.csv training steps: first fit (\d+)\.\.(\d+), after the resume (\d+)\.\.(\d+) \((\d+) rows\)$",
        text,
        re.M,
    )
    assert logged, text[-3000:]
    # one log: the resume appended its steps to the first fit's rows
    assert tuple(map(int, logged.groups())) == (0, s0 - 1, 0, new_max - 1, new_max), logged.groups()


def check_your_own_model(text: str, nb: nbformat.NotebookNode) -> None:
    final = re.search(r"^final metrics: val_loss ([\d.]+), val_acc ([\d.]+) \(chance 0\.25\)$", text, re.M)
    assert final, text[-3000:]
    val_loss, val_acc = map(float, final.groups())
    assert val_acc > 0.8 and val_loss < 0.5, (val_loss, val_acc)  # learned: 4 classes, chance is 0.25
    drop = re.search(r"^train loss: first 10 steps ([\d.]+), last 10 steps ([\d.]+), ", text, re.M)
    assert drop, text[-3000:]
    first, last = map(float, drop.groups())
    assert first > 3 * last, (first, last)
    # The plot: written as a PNG under the run folder, and shown inline.
    plot = re.search(r"^plot: (\S+\.png) \((\d+) bytes\)$", text, re.M)
    assert plot, text[-3000:]
    png = REPO / plot.group(1)
    assert png.is_file() and png.stat().st_size == int(plot.group(2)) > 1000, png
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    shown = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if "image/png" in o.get("data", {})
    ]
    assert len(shown) == 1, "the loss curve is not displayed in the notebook"


CHECKS: dict[str, Callable[[str, nbformat.NotebookNode], None]] = {
    "quickstart.ipynb": check_quickstart,
    "distributed_cpu.ipynb": check_distributed_cpu,
    "your_own_model.ipynb": check_your_own_model,
}


# ---- the tests ----------------------------------------------------------------------------------------


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes_and_prints_its_results(path: Path):
    assert path.name in CHECKS, (
        f"{path.name} has no output checks in {Path(__file__).name}: add them to CHECKS"
    )
    nb = nbformat.read(path, as_version=4)
    text, seconds = execute(nb)
    print(f"{path.name}: executed in {seconds:.1f} s")
    CHECKS[path.name](text, nb)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_without_outputs(path: Path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)
    ]
    assert not dirty, (
        f"{path.name}: code cells {dirty} hold outputs or an execution count; clear them before committing"
    )


@pytest.mark.timeout(120)
def test_spawn_in_a_notebook_refuses_a_class_defined_in_it_in_one_line():
    """A spawned rank cannot import a class defined in the notebook: a one-line error before any process starts
    (the ranks would otherwise die on the kernel's stderr and the notebook show "process 1 terminated")."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import lightning as L\n"
            "import torch\n"
            "from torch.utils.data import DataLoader, TensorDataset\n"
            "import distlab\n"
            "from distlab.optim import DistMuonAdamW, muon_param_groups\n"
            "\n"
            "class DefinedHere(L.LightningModule):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))\n"
            "    def training_step(self, batch, batch_idx):\n"
            "        return self.net(batch[0]).square().mean()\n"
            "    def configure_optimizers(self):\n"
            "        return DistMuonAdamW(muon_param_groups(self.net))\n"
            "\n"
            "trainer = L.Trainer(accelerator='cpu', devices=2, strategy='ddp_optimizer_sync_spawn', max_steps=2,\n"
            "                    logger=False, enable_checkpointing=False)\n"
            "trainer.fit(DefinedHere(), DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=4))\n"
        )
    ]
    with pytest.raises(CellExecutionError) as raised:
        execute(nb)
    error = raised.value
    assert error.ename == "ConfigError", (error.ename, error.evalue)
    assert error.evalue.startswith(
        "DefinedHere defined in this notebook / session cannot reach the spawned ranks"
    ), error.evalue
    assert "\n" not in error.evalue and "%%writefile" in error.evalue, error.evalue


# ---- the checks above can fail: each planted defect in a good output is caught ----------------------

GOOD_DISTRIBUTED = """\
rank 0 of 2: start step 0, end step 8, 28736 params, sum +1.633875321216e+03, sha256 5b6406d5986c7caa
rank 1 of 2: start step 0, end step 8, 28736 params, sum +1.633875321216e+03, sha256 5b6406d5986c7caa
parameters identical on both ranks: True
runs/notebooks/distributed_cpu/fit/checkpoints/last.ckpt holds step 8
val_loss: fit (rank 0 of 2) 3.32511425   validate (1 process) 3.32511425   |diff| 0.0e+00
val_ppl: fit (rank 0 of 2) 27.80217171   validate (1 process) 27.80217171   |diff| 0.0e+00
val_bpb: fit (rank 0 of 2) 4.79712582   validate (1 process) 4.79712582   |diff| 0.0e+00
early stop: rank 0 stopped at step 8, rank 1 at step 8 (max_steps 40)
rank 0 of 2: start step 8, end step 16, 28736 params, sum +1.965844778065e+03, sha256 fe5f850937866f70
rank 1 of 2: start step 8, end step 16, 28736 params, sum +1.965844778065e+03, sha256 fe5f850937866f70
resume: rank 0 started at step 8, ended at step 16
resume: rank 1 started at step 8, ended at step 16
metrics.csv training steps: first fit 0..7, after the resume 0..15 (16 rows)
"""

PLANTED_DISTRIBUTED = {
    "rank 1's checksum differs": (
        "sum +1.633875321216e+03, sha256 5b6406d5986c7caa\nparam",
        "sum +1.633875321216e+03, sha256 5b6406d5986c7cab\nparam",
    ),
    "rank 1's sum differs": (
        "rank 1 of 2: start step 0, end step 8, 28736 params, sum +1.633875321216e+03",
        "rank 1 of 2: start step 0, end step 8, 28736 params, sum +1.633875321217e+03",
    ),
    "validation differs": ("validate (1 process) 3.32511425", "validate (1 process) 3.32521425"),
    "rank 1 stopped later": ("rank 1 at step 8 (max_steps", "rank 1 at step 12 (max_steps"),
    "did not stop early": ("at step 8 (max_steps 40)", "at step 8 (max_steps 8)"),
    "resume restarted from 0": ("resume: rank 1 started at step 8", "resume: rank 1 started at step 0"),
    "resume missed max_steps": (
        "resume: rank 0 started at step 8, ended at step 16",
        "resume: rank 0 started at step 8, ended at step 12",
    ),
    "the earlier log lost": ("after the resume 0..15 (16 rows)", "after the resume 8..15 (8 rows)"),
    "a rank is missing": (
        "rank 1 of 2: start step 8, end step 16, 28736 params, sum +1.965844778065e+03, sha256 fe5f850937866f70\n",
        "",
    ),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("planted", PLANTED_DISTRIBUTED, ids=str)
def test_distributed_checks_catch_a_planted_defect(planted: str):
    check_distributed_cpu(GOOD_DISTRIBUTED, nbformat.v4.new_notebook())  # the good output passes
    old, new = PLANTED_DISTRIBUTED[planted]
    assert old in GOOD_DISTRIBUTED, planted
    with pytest.raises(AssertionError):
        check_distributed_cpu(GOOD_DISTRIBUTED.replace(old, new, 1), nbformat.v4.new_notebook())


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "planted", ["good", "chance accuracy", "loss did not drop", "empty plot", "plot not shown"]
)
def test_own_model_checks_catch_a_planted_defect(planted: str, tmp_path: Path):
    png = tmp_path / "loss_curve.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(2000))
    text = (
        f"plot: {png} ({png.stat().st_size} bytes)\n"
        "final metrics: val_loss 0.0843, val_acc 0.9754 (chance 0.25)\n"
        "train loss: first 10 steps 1.3594, last 10 steps 0.0883, 15.4x lower\n"
    )
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("plt.show()")]
    nb.cells[0].outputs = [nbformat.v4.new_output("display_data", data={"image/png": "iVBOR"})]
    if planted == "chance accuracy":
        text = text.replace("val_acc 0.9754", "val_acc 0.2754")
    elif planted == "loss did not drop":
        text = text.replace("last 10 steps 0.0883", "last 10 steps 0.9883")
    elif planted == "empty plot":
        png.write_bytes(b"")
    elif planted == "plot not shown":
        nb.cells[0].outputs = []
    if planted == "good":
        check_your_own_model(text, nb)
    else:
        with pytest.raises(AssertionError):
            check_your_own_model(text, nb)
