"""A finding: one lint's verdict on one thing (a rule, a tensor, a collective row, the plan).

Plain values only, so that a plan's `findings` section round-trips exactly and sorts deterministically.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Severity = Literal["info", "warning", "error"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "error")

# A rule's subject names its position, which moves when rules are inserted above it: diffs match findings
# on rules by the rule itself.
_RULE_INDEX = re.compile(r"^logical_axis_rules\[\d+\] ")


@dataclass(frozen=True)
class Finding:
    """What a lint found.

    Attributes:
      lint: the lint's id (`dead-rule`, …; `shardscope lint --explain ID` tells what it checks).
      severity: info, warning or error.
      subject: what it points at: a rule (`logical_axis_rules[12] [activation_q_length, ['context']]`), a
        tensor path, a logical name, a collective row, or the plan.
      message: what is wrong, with the figures that show it.
      fix: how to fix it.
    """

    lint: str
    severity: Severity
    subject: str
    message: str
    fix: str

    @property
    def key(self) -> tuple[str, str]:
        """Its identity across two plans: the lint and the subject (a rule without its position)."""
        return (self.lint, _RULE_INDEX.sub("logical_axis_rules ", self.subject))


def severity_rank(severity: str) -> int:
    """info 0, warning 1, error 2."""
    return SEVERITIES.index(severity)


def sort_findings(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """Most severe first, then by lint and subject (rules in file order): one order for every plan."""

    def order(finding: Finding) -> tuple[Any, ...]:
        match = re.match(r"^logical_axis_rules\[(\d+)\]", finding.subject)
        position = (0, int(match.group(1)), "") if match else (1, 0, finding.subject)
        return (-severity_rank(finding.severity), finding.lint, position, finding.message)

    return tuple(sorted(set(findings), key=order))


def count_by_severity(findings: Sequence[Finding]) -> dict[str, int]:
    """{"error": n, "warning": n, "info": n} (every severity, most severe first)."""
    return {severity: sum(f.severity == severity for f in findings) for severity in reversed(SEVERITIES)}
