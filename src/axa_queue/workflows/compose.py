"""`chain`, `group` and `chord`: jobs composed into a workflow, queued whole in one
statement (`jobs.linked`), Celery's canvas without its broker round trips.

- `chain(a, b, c)`: `b` after `a`, `c` after `b`;
- `group([a, b])`: side by side, nothing between them;
- `chord(group([a, b]), c)`: `c` after every job of the group;
- any of them inside another: a step of a chain may be a group (the next step then
  waits for all of it), a group's member a chain, and so on.

A job waits for the jobs before it to complete; what happens when one fails or is
cancelled is each waiting job's `on_parent_failure` (docs/workflows.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import OptionsError
from ..jobs.linked import Composition, Flat
from ..jobs.model import NewJob

__all__ = ["Chain", "Chord", "Group", "Step", "chain", "chord", "group"]

Step = NewJob | Composition
"""What a workflow is made of: jobs, and workflows."""


def _checked(step: object, where: str) -> Step:
    if isinstance(step, (NewJob, Composition)):
        return step
    raise OptionsError(
        f"expected each step of a {where} to be a NewJob, a chain, a group or a chord, "
        f"got a {type(step).__name__}"
    )


def _place(
    step: Step, before: tuple[int, ...], jobs: list[NewJob], parents: list[tuple[int, ...]]
) -> tuple[int, ...]:
    """Add `step`'s jobs, each of its first ones after `before`; the places its last
    ones have (what comes after it waits for)."""
    if isinstance(step, NewJob):
        jobs.append(step)
        parents.append(before)
        return (len(jobs) - 1,)
    if isinstance(step, Chain):
        for one in step.steps:
            before = _place(one, before, jobs, parents)
        return before
    if isinstance(step, Group):
        ends: list[int] = []
        for one in step.members:
            ends.extend(_place(one, before, jobs, parents))
        return tuple(ends)
    if isinstance(step, Chord):
        return _place(step.callback, _place(step.header, before, jobs, parents), jobs, parents)
    flat = step.flatten()  # another kind of composition: placed as it flattens
    offset = len(jobs)
    for job, own in zip(flat.jobs, flat.parents, strict=True):
        jobs.append(job)
        parents.append(tuple(offset + p for p in own) if own else before)
    last = set(range(len(flat.jobs))) - {p for own in flat.parents for p in own}
    return tuple(offset + p for p in sorted(last))


def _flat(step: Step) -> Flat:
    jobs: list[NewJob] = []
    parents: list[tuple[int, ...]] = []
    _place(step, (), jobs, parents)
    return Flat(tuple(jobs), tuple(parents))


@dataclass(frozen=True)
class Chain(Composition):
    """Steps run one after another (`chain`)."""

    steps: tuple[Step, ...]

    def flatten(self) -> Flat:
        return _flat(self)


@dataclass(frozen=True)
class Group(Composition):
    """Members run side by side (`group`)."""

    members: tuple[Step, ...]

    def flatten(self) -> Flat:
        return _flat(self)


@dataclass(frozen=True)
class Chord(Composition):
    """A group, then a callback after all of it (`chord`)."""

    header: Group
    callback: Step

    def flatten(self) -> Flat:
        return _flat(self)


def chain(*steps: Step) -> Chain:
    """`steps` one after another: each waits for the one before to complete (for a
    group: all of it). Queue it with `enqueue_on` or `Queue.enqueue`: a `Workflow`."""
    if not steps:
        raise OptionsError("a chain needs at least one step: chain(a, b, ...)")
    return Chain(tuple(_checked(one, "chain") for one in steps))


def group(members: Iterable[Step]) -> Group:
    """`members` side by side, none waiting for another (they all wait for what comes
    before the group, in a chain). Give it a list: `group([a, b])`."""
    if isinstance(members, (NewJob, Composition)):
        raise OptionsError("group takes a list of steps: group([a, b, ...])")
    found = tuple(_checked(one, "group") for one in members)
    if not found:
        raise OptionsError("a group needs at least one member: group([a, b, ...])")
    return Group(found)


def chord(header: Group | Iterable[Step], callback: Step) -> Chord:
    """`header` (a group, or its members), then `callback` once every one of them
    completed; the callback reads their results in the group's order
    (`JobContext.parent_results`)."""
    return Chord(
        header if isinstance(header, Group) else group(header), _checked(callback, "chord")
    )
