"""What the worker's services share: its phase (`Phase`), and the runs it holds (each
a `run.Run`, which goes through its own `RunPhase`s).

From its claim, a run is held here until its ending is recorded, or its fate written
once it lost its claim (docs/design.md draws it)::

    claimed, waiting -> running -> ended -> recorded
           \\               \\         \\
            +---------------+---------+--> lost (its fate written by `sql.MARK_LOST`)

`State.runs` holds every run from its claim until its loop lets it go (its ending is
then in `endings`, or `sending` while a statement carries it, or `apart` while it
cannot be recorded, or `row_held` while another transaction holds its job's row);
`State.losing` holds
every run that lost its claim until its fate is written, and keeps its place
meanwhile, so this process never claims that job again before.
"""

from __future__ import annotations

import asyncio
import enum
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

from . import decisions
from .run import RUNNING, Run

__all__ = ["Phase", "State"]


class Phase(enum.IntEnum):
    """The worker's phase; it only ever moves forward."""

    STARTING = 0
    """Made, its services not yet started."""
    WORKING = 1
    """Claiming and running jobs."""
    STOPPING = 2
    """No more claims: jobs in progress finish, their endings are recorded."""
    CLOSING = 3
    """Every run has ended: the exchange loop returns once every ending is recorded."""
    STOPPED = 4
    """Its tasks are ended and its connections closed."""


class State:
    """The worker's phase and the runs it holds, shared by its services; event loop only."""

    def __init__(self, workers: int, prefetch: int | str) -> None:
        self.phase = Phase.STARTING
        self.slots = workers
        self.auto = not isinstance(prefetch, int)
        """Whether `prefetch` is `"auto"`: what is claimed ahead follows how long runs
        take (`pace`)."""
        self.most_ahead = decisions.AUTO_PREFETCH if isinstance(prefetch, str) else prefetch
        self.paces: dict[str, float] = {}
        """How long each name's runs take here, a running average (`prefetch="auto"`)."""
        self.ahead = 0
        self.room = self.low_water = 0
        self._claim_ahead(0 if self.auto else self.most_ahead)
        self.runs: dict[tuple[str, int], Run] = {}
        """Every run claimed and not yet let go by its loop."""
        self.waiting: list[Run] = []
        """Runs claimed ahead (`prefetch`), best first, waiting for a loop."""
        self.active = 0
        """Runs whose handler has started and not yet ended."""
        self.in_use: Counter[str] = Counter()
        """Places held per job name (for the limits)."""
        self.endings: list[Run] = []
        """Runs that ended, waiting to be written."""
        self.endings_since = 0.0
        """When the oldest ending not yet sent was made (event loop time)."""
        self.sending: list[Run] = []
        """The endings in the statement in flight."""
        self.apart: list[Run] = []
        """Endings that could be recorded neither as they were nor as failures (their
        statement failed even alone), kept claimed and tried again on their own
        (`Exchange.isolate`)."""
        self.row_held: list[Run] = []
        """Endings whose job row another transaction holds (an open transaction that
        locked it), kept aside so the others go on, and sent once it is free
        (`held.HeldRows`)."""
        self.starts: list[Run] = []
        """Runs claimed ahead whose handler started, to be marked started (their row's
        `ahead` cleared) by the next exchange, which the loop does not wait for."""
        self.losing: dict[str, Run] = {}
        """Runs that lost their claim, by job id, until their fate is written."""
        self.heard = 0.0
        """When the last heartbeat that answered was sent (or found nothing to prove),
        on the clock the worker times its claims by: long ago, the process may have
        stalled (its event loop blocked, the database away) and lost claims it does
        not know of yet (`fence`)."""
        self.nudge = asyncio.Event()
        """Set when there may be something to do: an ending, a free loop, new work."""
        self.back = asyncio.Event()
        """Set, and made anew, when the database answers again after failures
        (`database_back`): a background service waiting to try again after a failure
        (housekeeping, the history's moves) tries at once."""
        self.look = True
        """Whether there may be work not looked for yet (else exchanges only record)."""
        self.held_back: frozenset[str] = frozenset()
        """Names the last claim held back (left out by their pace or limit, or given as
        many as their cap): they may have jobs ready, so a loop coming free looks again."""
        self.wakes = 0
        """How many times something said there may be new work."""
        self.claiming = False
        """Whether a statement in flight may bring new runs."""
        self.wake_at: asyncio.TimerHandle | None = None
        self.stats: Counter[str] = Counter()
        """Outcomes, each counted once its write is confirmed."""
        self.check = asyncio.Event()
        """Set when a notification says a job this process runs may have been cancelled:
        the heartbeat loop reports in at once (`check_soon`)."""

    def fence(self, stalled: Callable[[], bool]) -> str:
        """The exchange's `losing` parameter: the jobs it must not claim. Always those
        of runs that lost their claim until their fate is written; and, when the process
        may have stalled since its last heartbeat (`stalled()`, `Claims.stalled`: asked
        only while it holds runs), every job it holds
        a run of: recovery may have queued one again while its run here goes on (a
        blocked event loop has not yet heard), and a claim of it now would make a second
        run of it in this process, at once. The next heartbeat settles them."""
        if self.runs and stalled():
            return "{" + ",".join({*self.losing, *(one.id for one in self.runs.values())}) + "}"
        return "{" + ",".join(self.losing) + "}"

    def _claim_ahead(self, ahead: int) -> None:
        """Claim up to `ahead` jobs ahead of the loops from now on."""
        self.ahead = ahead
        self.room = decisions.room(self.slots, ahead)
        self.low_water = decisions.low_water(self.slots, ahead)

    def ran(self, name: str, seconds: float) -> None:
        """A run of `name` took `seconds` (its handler's time): with `prefetch="auto"`,
        the name's pace follows."""
        if not self.auto:
            return
        mean = self.paces.get(name)
        weight = decisions.RUN_SECONDS_WEIGHT
        self.paces[name] = seconds if mean is None else mean + (seconds - mean) * weight

    def pace(self) -> dict[str, int] | None:
        """With `prefetch="auto"`, before a claim: how many jobs of each name may wait
        ahead (`decisions.ahead`: what the loops would start within
        `decisions.PREFETCH_HORIZON` at that name's pace, counting only the loops not
        held by a run that frees its loop later than that: one of a name timed longer,
        or not timed yet), and so how many in all (the most of any name); `None` with a
        fixed `prefetch`."""
        if not self.auto:
            return None
        paces, horizon = self.paces, decisions.PREFETCH_HORIZON
        held = 0
        for one in self.runs.values():
            if one.phase is RUNNING:
                seconds = paces.get(one.name)
                if seconds is None or seconds > horizon:
                    held += 1
        loops, most = self.slots - held, self.most_ahead
        by_name = {name: decisions.ahead(loops, seconds, most) for name, seconds in paces.items()}
        ahead = max(by_name.values(), default=0)
        if ahead != self.ahead:
            self._claim_ahead(ahead)
        return by_name

    def waiting_by_name(self) -> Counter[str]:
        """How many runs of each name wait for a loop."""
        return Counter(one.name for one in self.waiting)

    @property
    def stopping(self) -> bool:
        return self.phase >= Phase.STOPPING

    def idle(self) -> int:
        """Loops that no run holds or waits for: how many runs claimed now start at once."""
        return max(self.slots - self.active - len(self.waiting), 0)

    def held(self) -> int:
        """Places held: runs claimed, runs lost whose fate is not yet written, and
        endings kept apart (so a worker that cannot record its endings stops claiming
        once they fill its places)."""
        if not self.losing:  # nearly always: no generator for it
            return len(self.runs) + len(self.apart) + len(self.row_held)
        extra = sum(1 for one in self.losing.values() if one.key not in self.runs)
        return len(self.runs) + extra + len(self.apart) + len(self.row_held)

    def free(self) -> int:
        return decisions.free_places(self.stopping, self.room, self.held())

    def due(self) -> bool:
        return decisions.due(
            stopping=self.stopping,
            active=self.active,
            slots=self.slots,
            waiting=len(self.waiting),
            low_water=self.low_water,
            endings=len(self.endings),
            room=self.room,
        )

    def poke(self) -> None:
        """Wake the exchange loop if it has something to send now; endings that may
        wait are sent by the `HOLD_ENDINGS` timer (set by the loop) at the latest."""
        if self.due():
            self.nudge.set()

    def database_back(self) -> None:
        """The database answers again after failures: wake whoever waits on `back`."""
        self.back.set()
        self.back = asyncio.Event()

    def wake(self) -> None:
        """Look for work at the next exchange, now."""
        self.look_next()
        self.nudge.set()

    def look_next(self) -> None:
        """Look for work at the next exchange, without waking the exchange loop: for a
        caller about to add an ending (`end`), which brings that exchange (at once when
        a loop is free: the loop's `poke`; else within `HOLD_ENDINGS`)."""
        self.wakes += 1
        self.look = True

    def wake_in(self, delay: timedelta | float) -> None:
        """Look for work again after `delay`, keeping only the earliest such timer."""
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
        if seconds <= 0:
            self.wake()
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + seconds
        if self.wake_at is not None and not self.wake_at.cancelled():
            if self.wake_at.when() <= when and self.wake_at.when() > loop.time():
                return
            self.wake_at.cancel()
        self.wake_at = loop.call_at(when, self.wake)

    def check_soon(self, job_id: str) -> None:
        """A job was cancelled (`sql.CANCEL_CHANNEL`): if this process runs it, report in
        now, and the heartbeat says whether the run is cancelled (the notification may
        name another schema's job; only the heartbeat is believed)."""
        if any(one.id == job_id for one in self.runs.values()):
            self.check.set()

    def end(self, ending: Run) -> None:
        """Add an ending to be written by the next exchange."""
        if not self.endings and not self.starts:
            self.endings_since = asyncio.get_running_loop().time()
            self.nudge.set()  # the exchange loop sends it, or sets the timer that will
        self.endings.append(ending)

    def started(self, one: Run) -> None:
        """A run claimed ahead starts on a loop: its start is marked by the next exchange
        (sent like an ending: at once, or within `HOLD_ENDINGS` while every loop is
        busy), which no one waits for."""
        if not self.endings and not self.starts:
            self.endings_since = asyncio.get_running_loop().time()
            self.nudge.set()
        self.starts.append(one)

    def held_literals(self) -> tuple[str, str]:
        """The (ids, attempts) of every run this process holds, as array literals."""
        every = [
            *self.runs.values(),
            *self.sending,
            *self.endings,
            *self.apart,
            *self.row_held,
            *self.losing.values(),
        ]
        held = list({one.key: one for one in every}.values())
        return (
            "{" + ",".join(r.id for r in held) + "}",
            "{" + ",".join(str(r.attempts) for r in held) + "}",
        )
