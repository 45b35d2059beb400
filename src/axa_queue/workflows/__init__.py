"""Workflows: jobs that wait for other jobs (`chain`, `group`, `chord`, and
`NewJob(after=...)`), queued whole in one statement, released by the statement that
ends their parents (docs/workflows.md)."""

from __future__ import annotations

from ..jobs.linked import Composition, Workflow
from .compose import Chain, Chord, Group, chain, chord, group
from .operate import Member, WorkflowInfo, cancel_workflow, workflow_on

__all__ = [
    "Chain",
    "Chord",
    "Composition",
    "Group",
    "Member",
    "Workflow",
    "WorkflowInfo",
    "cancel_workflow",
    "chain",
    "chord",
    "group",
    "workflow_on",
]
