"""The kinds of change a diff reports, in report order."""

from __future__ import annotations

from enum import StrEnum


class ChangeKind(StrEnum):
    """What a change is about; its value is how the diff JSON and reports spell it."""

    CASE = "case"
    EXTRA_CHANGED = "extra_changed"  # unknown top-level plan fields
    MEMORY_CHANGED = "memory_changed"
    COMPUTE_CHANGED = "compute_changed"
    TENSOR_REMOVED = "tensor_removed"
    TENSOR_ADDED = "tensor_added"
    TENSOR_CHANGED = "tensor_changed"  # its shape, dtype, kind or logical axes
    SPEC_CHANGED = "spec_changed"
    COLLECTIVE_REMOVED = "collective_removed"
    COLLECTIVE_ADDED = "collective_added"
    COLLECTIVE_CHANGED = "collective_changed"
    # Lint findings a change resolved, added, or changed the figures of (same lint, same subject).
    FINDING_RESOLVED = "finding_resolved"
    FINDING_ADDED = "finding_added"
    FINDING_CHANGED = "finding_changed"


TENSOR_CHANGE_KINDS = (
    ChangeKind.TENSOR_REMOVED,
    ChangeKind.TENSOR_ADDED,
    ChangeKind.TENSOR_CHANGED,
    ChangeKind.SPEC_CHANGED,
)
COLLECTIVE_CHANGE_KINDS = (ChangeKind.COLLECTIVE_REMOVED, ChangeKind.COLLECTIVE_ADDED, ChangeKind.COLLECTIVE_CHANGED)
FINDING_CHANGE_KINDS = (ChangeKind.FINDING_RESOLVED, ChangeKind.FINDING_ADDED, ChangeKind.FINDING_CHANGED)
# Every kind of change, in report order.
CHANGE_KINDS = tuple(ChangeKind)
