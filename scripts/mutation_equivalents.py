"""Tool mutants triaged as equivalent: no test can catch them because the program behaves the same.

`make mutation` reports a drawn mutant that matches one of these as "equivalent (reason)" and does not run
it. A record is keyed on what the mutant is, not where: (file, function, operator, the statement before and
after the mutation as ``ast.unparse`` writes it), so it survives edits elsewhere in the file. To add one, copy
the mutant's `key` from runs/mutation/report.json and say why no behaviour changes.
tests/unit/test_mutation_list.py fails when a record no longer matches any mutant (the code changed: triage
again).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Equivalent:
    file: str
    function: str
    operator: str  # as the report shows it, e.g. "Add_Sub", "NumberReplacer"
    before: str
    after: str
    reason: str

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.file, self.function, self.operator, self.before, self.after)


EQUIVALENT: tuple[Equivalent, ...] = (
    Equivalent(
        "distlab/modules/metrics.py",
        "LanguageModelMetrics",
        "ReplaceFalseWithTrue",
        "higher_is_better = False",
        "higher_is_better = True",
        "torchmetrics reads higher_is_better only in MetricTracker(maximize=None), which cannot rank this "
        "metric's dict result either way, and in plot(), which marks the optimum only for a metric that declares "
        "plot bounds (this one declares none); distlab and Lightning never read it",
    ),
)
