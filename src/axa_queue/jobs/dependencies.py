"""A job's dependencies as `NewJob` is given them (`after`, `on_parent_failure`),
checked before anything is sent; docs/workflows.md."""

from __future__ import annotations

from collections.abc import Iterable
from uuid import UUID

from ..errors import OptionsError
from .ids import job_id_of

__all__ = ["POLICIES", "check_after"]

POLICIES = ("cancel", "run")
"""What a dependency says of a parent that fails (no attempts left) or is cancelled:
cancel the dependent (the default), or run it as if the parent had completed."""


def check_after(
    name: str, after: Iterable[UUID | str], policy: str, unique_key: str | None
) -> tuple[UUID, ...]:
    """The ids job `name` depends on, checked with its `on_parent_failure` (`policy`):
    an `OptionsError` naming the option, never an argument."""
    if policy not in POLICIES:
        raise OptionsError(
            f'expected on_parent_failure of job {name!r} to be "cancel" or "run", got: {policy!r}'
        )
    if isinstance(after, (str, UUID)):
        raise OptionsError(
            f"expected after of job {name!r} to be a list of job ids, got a single id: "
            "put it in a list"
        )
    ids = tuple(job_id_of(one) for one in after)
    if len(set(ids)) < len(ids):
        raise OptionsError(f"job {name!r} names a job in after twice: name each once")
    if ids and unique_key is not None:
        raise OptionsError(
            f"job {name!r} was given after and a unique_key: a job with dependencies "
            "cannot have a unique key; give one or the other"
        )
    return ids
