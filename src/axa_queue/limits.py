"""Limits: how many runs of a job name at once, how many claims of it per window, and
how many tries a job gets. The one owner of each: registered here (with no I/O, at
import time), checked here against their bounds, and read from here by the worker.

- **Per-name limits** (`Queue.limit(name, n)`, `Limits.process`): at most `n` runs of
  the name at once in this process. The exchange asks for no more than the places a
  name has free (`Limits.places`, through `worker.decisions.wanted`).
- **Global limits** (`Queue.limit(name, n, scope="global")`, `Limits.global_`): at
  most `n` at once across every process. Each claim carries the limit in its `wanted`
  JSON, and `sql.EXCHANGE_LIMITED` cuts the name's cap to `axa_queue_room` (migration
  6), which counts every process's running jobs of the name under the name's lock.
- **Rate limits** (`Queue.rate_limit(name, n, per=...)`, `Limits.rate`): at most `n`
  claims of the name in any window of `per`, across every process, by the slots of
  `axa_rate_slots` that `sql.EXCHANGE_RATED` reads (`axa_queue_rate_slots_free`, migration
  23) and stamps, under the same lock.
- **Per-key limits** (`Queue.limit_per_key(name, n)`, `Limits.per_key`): at most `n`
  runs of the name at once for each key (`NewJob.key`), across every process. The name
  is then claimed by key (`Limits.keyed`, also `Queue.fair_by_key` without a limit):
  `sql.EXCHANGE_KEYED` takes its keys' jobs in turn, and cuts each key's share to the
  limit less its running jobs, counted by `axa_queue_key_room` (migration 15) under
  the name's lock.
- **The attempt limit** (`AttemptLimits`): the tries a job gets, the first included:
  its own `max_attempts` (on its row), else its handler's (`Policy.max_attempts`),
  else the queue's `QueueOptions.max_attempts`. Resolved by `AttemptLimits.of`, and the
  same answer goes to every statement that judges a run by it: the claim (the run's
  limit, `Run.limit`), a lost run (`sql.MARK_LOST`, given the run's limit), a stop
  giving runs back (`sql.GIVE_BACK`), and stale recovery (`sql.RECOVER_STALE` and
  `sql.STALE`, given `AttemptLimits.params`, for jobs of any process).

The bounds (`MAX_LIMIT`, `MAX_RATE`, `MAX_WINDOW`) are the ones the claim statements
clamp a value to (a registry written to by hand must not fail the claim of every
other name): `tests/test_limits.py` checks the statements carry these numbers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from .errors import OptionsError
from .options import MAX_DURATION, MAX_INTEGER

__all__ = [
    "MAX_LIMIT",
    "MAX_RATE",
    "MAX_WINDOW",
    "AttemptLimits",
    "Limits",
    "Scope",
]

MAX_LIMIT = MAX_INTEGER
"""The largest per-name or global limit: PostgreSQL's `integer`, which
`axa_queue_room` takes (`sql.EXCHANGE_LIMITED` clamps a larger one to it)."""

MAX_RATE = 100_000
"""The most claims a rate limit allows per window (`Queue.rate_limit`): each is a slot
row the name keeps, and every claim of the name reads them (and, until the ring is
whole, looks for the numbers without a row), inside the statement that claims every
name's jobs. The claim statement clamps a larger value to this one."""

MAX_WINDOW = MAX_DURATION
"""The longest window of a rate limit: 100 years, as any duration (the claim statement
clamps a longer one, in milliseconds, to it)."""

Scope = Literal["process", "global"]
"""Where a limit on runs at once holds: in this process, or across every process."""


def _count(jobs: object) -> str:
    """A limit given, as an error message shows it: an integer itself, else only its
    type (a value of the wrong kind is never echoed)."""
    return str(jobs) if isinstance(jobs, int) else type(jobs).__name__


@dataclass(eq=False)
class Limits:
    """The per-name, global and rate limits of one queue (no I/O): what `Queue.limit`
    and `Queue.rate_limit` register, checked, and what the worker's claims honour."""

    process: dict[str, int] = field(default_factory=dict)
    """At most this many runs of the name at once in this process."""
    global_: dict[str, int] = field(default_factory=dict)
    """At most this many runs of the name at once across every process (checked by the
    claim statement, `sql.EXCHANGE_LIMITED`)."""
    rate: dict[str, tuple[int, int]] = field(default_factory=dict)
    """At most this many claims of the name in any window of that many milliseconds,
    across every process (checked and stamped by the claim statement,
    `sql.EXCHANGE_RATED`)."""

    keyed: set[str] = field(default_factory=set)
    """The names claimed by key: their keys' jobs taken in turn (`sql.EXCHANGE_KEYED`)."""
    per_key: dict[str, int] = field(default_factory=dict)
    """At most this many runs of the name at once for each key, across every process
    (checked by `sql.EXCHANGE_KEYED`); such a name is claimed by key."""
    after: dict[str, str] = field(default_factory=dict)
    """Where the last claim's walk of each keyed name stopped (a key): the next claim
    starts after it, so keys take turns across claims. This process's own, never shared."""

    def limit(self, name: str, jobs: int, scope: Scope = "process") -> None:
        """Register a limit of `jobs` runs of `name` at once (1 to `MAX_LIMIT`), in this
        process or across every process (`scope`); an `OptionsError` names the job and
        the bound of a value out of it. The name itself is checked by the caller."""
        if not isinstance(jobs, int) or isinstance(jobs, bool) or not 1 <= jobs <= MAX_LIMIT:
            raise OptionsError(
                f"expected the limit of job {name!r} to be a positive integer of at most "
                f"{MAX_LIMIT}, got: {_count(jobs)}"
            )
        if scope == "process":
            self.process[name] = jobs
        elif scope == "global":
            self.global_[name] = jobs
        else:
            raise OptionsError(
                f'expected the scope of the limit of job {name!r} to be "process" or '
                f'"global", got: {scope!r}'
            )

    def rate_limit(self, name: str, jobs: int, per: timedelta) -> None:
        """Register a rate limit of `jobs` claims of `name` (1 to `MAX_RATE`) in any
        window of `per` (a positive `timedelta` of at most `MAX_WINDOW`, kept in whole
        milliseconds, rounded up); an `OptionsError` names the job and the bound."""
        if not isinstance(jobs, int) or isinstance(jobs, bool) or not 1 <= jobs <= MAX_RATE:
            raise OptionsError(
                f"expected the rate limit of job {name!r} to be a positive integer of at most "
                f"{MAX_RATE} (each claim of the name reads as many slots), got: {_count(jobs)}"
            )
        if not isinstance(per, timedelta) or per <= timedelta(0) or per > MAX_WINDOW:
            raise OptionsError(
                f"expected per= of the rate limit of job {name!r} to be a positive "
                f"timedelta (such as timedelta(seconds=1)) of at most {MAX_WINDOW.days} "
                f"days, got: {per if isinstance(per, timedelta) else type(per).__name__}"
            )
        self.rate[name] = (jobs, math.ceil(per / timedelta(milliseconds=1)))

    def limit_per_key(self, name: str, jobs: int) -> None:
        """Register a limit of `jobs` runs of `name` at once per key (1 to `MAX_LIMIT`),
        across every process; the name is then claimed by key. An `OptionsError` names
        the job and the bound of a value out of it."""
        if not isinstance(jobs, int) or isinstance(jobs, bool) or not 1 <= jobs <= MAX_LIMIT:
            raise OptionsError(
                f"expected the per-key limit of job {name!r} to be a positive integer of at "
                f"most {MAX_LIMIT}, got: {_count(jobs)}"
            )
        self.per_key[name] = jobs
        self.keyed.add(name)

    def places(self, name: str, in_use: int, free: int) -> int:
        """How many jobs of `name` a claim may take now, with `in_use` of its runs held
        in this process and `free` places in all: its free places under a per-name
        limit, else all of them (a global or rate limit is the statement's to cut)."""
        most = self.process.get(name)
        return free if most is None else min(most - in_use, free)

    def gate(self, one: dict[str, Any]) -> None:
        """Add to `one`, a name wanted by a claim (`{"name", "cap"}`), its global limit
        (`global`) and its rate limit (`rate`, `per_ms`), as `sql.EXCHANGE_LIMITED` and
        `sql.EXCHANGE_RATED` read them, when it has them."""
        name = one["name"]
        most = self.global_.get(name)
        if most is not None:
            one["global"] = most
        rate = self.rate.get(name)
        if rate is not None:
            one["rate"], one["per_ms"] = rate
        if name in self.keyed:
            one["keyed"] = True
            one["per_key"] = self.per_key.get(name)
            one["after"] = self.after.get(name)

    @property
    def gated(self) -> bool:
        """Whether a claim must check limits of every process (a global or a rate
        limit): then it is `sql.EXCHANGE_LIMITED` or `sql.EXCHANGE_RATED`, which take
        the names' locks (in name order)."""
        return bool(self.global_ or self.rate or self.keyed)

    def holds_places(self, name: str) -> bool:
        """Whether runs of `name` hold places a limit counts (per-name or global): one
        ending frees a place its jobs may be waiting for, so the exchange looks again."""
        return name in self.process or name in self.global_ or name in self.per_key


@dataclass(frozen=True)
class AttemptLimits:
    """The effective attempt limit, resolved in one place (`of`): a job's own
    `max_attempts`, else its handler's (`handlers`, the handlers of this process that
    set one), else `default` (`QueueOptions.max_attempts`)."""

    default: int
    """The queue's `QueueOptions.max_attempts`."""
    handlers: Mapping[str, int] = field(default_factory=dict)
    """The `max_attempts` of each handler of this process that sets one, by job name."""

    def of(self, name: str, own: int | None = None) -> int:
        """The tries a job named `name` gets, the first included: `own` (the job's
        `max_attempts`, `None` when it was stored without one), else its handler's, else
        the queue's. Called for every job a claim takes: a dictionary look-up."""
        return own if own is not None else self.handlers.get(name, self.default)

    def params(self) -> dict[str, Any]:
        """This resolution as the stale-recovery statements take it (`sql.RECOVER_STALE`,
        `sql.STALE`): `max`, the default, and `limits`, the handlers' as a JSON object;
        each reads `COALESCE(max_attempts, (limits ->> name)::int, max)`, `of` in SQL."""
        return {"max": self.default, "limits": json.dumps(dict(self.handlers))}
