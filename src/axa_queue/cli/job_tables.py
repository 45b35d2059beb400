"""`show`'s tables: a job's fields, its attempts and its steps, for people; and a job as `show
--json` and `jobs --json` print it."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.table import Table

from .. import readable
from ..jobs.attempts import latest
from ..jobs.model import Attempt, JobInfo
from ..jobs.steps import Step
from .conventions import Printed
from .text import lines, shown, tries, when

__all__ = ["job_json", "job_table", "runs_table", "state_of", "steps_json", "steps_table"]


def state_of(info: JobInfo) -> str:
    """A job's state as the tables show it: `running (worker gone)` for a run whose
    worker process is gone (`JobInfo.worker_gone`)."""
    return info.state.value + (" (worker gone)" if info.worker_gone else "")


def job_json(info: JobInfo) -> dict[str, Any]:
    """A job as `show --json` and `jobs --json` print it: its fields under the keys they
    have always had (`attempts`, the number of runs, is `JobInfo.attempt`; `runs`, its
    attempts, is `JobInfo.attempts`: empty in `jobs`), each run with its length in
    seconds (`seconds`: from its claim to its ending, `null` while it runs),
    `worker_gone`, and its steps (`steps_json`)."""
    runs = [
        {
            **dataclasses.asdict(one),
            "seconds": None if one.duration is None else one.duration.total_seconds(),
        }
        for one in info.attempts
    ]
    keys = {"attempt": "attempts", "attempts": "runs"}
    fields = {keys.get(f.name, f.name): getattr(info, f.name) for f in dataclasses.fields(info)}
    return {**fields, "runs": runs, "steps": steps_json(info.steps)}


def runs_table(runs: tuple[Attempt, ...]) -> list[Printed]:
    """A job's attempts, a row each, oldest first: how each ended, when, how long it
    took, the worker process that ran it (host:pid) and its error; the latest
    `SHOWN_RUNS`, the earlier ones counted."""
    if not runs:
        return []
    left_out, shown_runs = latest(runs)
    table = Table(title="attempts", title_justify="left", box=None)
    for column in ("try", "outcome", "started", "ended", "took", "worker", "error"):
        table.add_column(column, no_wrap=column != "error")
    for one in shown_runs:
        worker = "-" if one.host is None else f"{shown(one.host)}:{one.pid}"
        table.add_row(
            str(one.attempt),
            (one.outcome or "running") + (" (from the job's row)" if one.derived else ""),
            when(one.started_at),
            when(one.ended_at),
            readable.seconds(one.duration),
            worker,
            lines(one.error),
        )
    if left_out:
        return [
            f"{left_out} earlier {'attempt' if left_out == 1 else 'attempts'} not shown "
            "(`show --json` lists every one)",
            table,
        ]
    return [table]


def job_table(info: JobInfo) -> Printed:
    table = Table(box=None, show_header=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for label, value in (
        ("id", str(info.id)),
        ("name", shown(info.name)),
        ("state", state_of(info)),
        ("tries", tries(info)),
        ("priority", str(info.priority)),
        ("timeout", readable.seconds(info.timeout)),
        ("run at", when(info.run_at)),
        ("started at", when(info.started_at)),
        ("created at", when(info.created_at)),
        ("updated at", when(info.updated_at)),
        ("error", lines(info.error)),
    ):
        table.add_row(label, value)
    if info.given_back:
        table.add_row("given back", f"{info.given_back} (claimed ahead, never started)")
    if info.unique_key is not None:
        table.add_row("unique key", shown(info.unique_key))
        if info.unique_for is not None:
            table.add_row("unique for", f"{readable.seconds(info.unique_for)} after it finished")
    return table


def steps_table(steps: tuple[Step, ...]) -> list[Printed]:
    """A job's durable steps, a row each, in the order recorded: the name, the attempt
    that recorded it, when, how long its function took. Never a step's result."""
    if not steps:
        return []
    table = Table(title="steps", title_justify="left", box=None)
    for column in ("step", "try", "recorded", "took"):
        table.add_column(column, no_wrap=True)
    for one in steps:
        table.add_row(
            shown(one.name), str(one.attempt), when(one.recorded_at), readable.seconds(one.duration)
        )
    return [table]


def steps_json(steps: tuple[Step, ...]) -> list[dict[str, Any]]:
    """A job's steps as `show --json` prints them: each one's fields and its length in
    seconds (`seconds`). Never a step's result."""
    return [{**dataclasses.asdict(one), "seconds": one.duration.total_seconds()} for one in steps]
