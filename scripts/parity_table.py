"""Print the Lightning-parity matrix as a table: each feature x each distlab strategy against Lightning's ``ddp``.

    python scripts/parity_table.py            # every cell (~30 s on 2 cores): one 2-rank gloo job
    python scripts/parity_table.py --only gradient_clip_norm accumulate_grad_batches

The cells, the user's module and the oracle are the ones tests/matrix/test_parity.py asserts on
(tests/helpers/parity.py); this script only reports what they measure: per cell, the largest difference of any
weight or buffer from the oracle's on any rank (0 = bit-equal), the step reached, and the tolerance the test allows
- or the one-line refusal the strategy gives. It asserts nothing; the test does.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from distlab.testing import run_distributed  # noqa: E402
from tests.helpers.parity import FEATURES, ORACLE, STRATEGIES, WORLD, parity_job  # noqa: E402


def max_difference(got: dict, ref: dict) -> float:
    return max(((got[k].double() - ref[k].double()).abs().max().item() for k in ref), default=0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="feature names (default: every feature)")
    args = parser.parse_args(argv)
    names = [f.name for f in FEATURES if not args.only or f.name in args.only]
    with tempfile.TemporaryDirectory() as root:
        by_rank = run_distributed(parity_job, WORLD, names, root, timeout=600)
    print(
        f"| feature | strategy | oracle ({ORACLE}, {WORLD} ranks) | max difference from the oracle | allowed |"
    )
    print("|---|---|---|---|---|")
    for f in FEATURES:
        if f.name not in names:
            continue
        oracle = [r[(f.name, ORACLE)] for r in by_rank]
        said = "refuses: " + oracle[0]["error"] if "error" in oracle[0] else f"step {oracle[0]['step']}"
        for s in STRATEGIES:
            outs = [r[(f.name, s)] for r in by_rank]
            if "error" in outs[0]:
                cell, allowed = f"refused: `{outs[0]['error']}`", "(a refusal)"
            else:
                diff = max(
                    max_difference(o["state"], ref["state"]) for o, ref in zip(outs, oracle, strict=True)
                )
                cell, allowed = f"{diff:.1e} at step {outs[0]['step']}", f"{f.tolerance(s):g}"
            print(f"| {f.name} | {s} | {said} | {cell} | {allowed} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
