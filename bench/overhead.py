"""What a run's job context, log fields and middleware cost, per job, without a database.

    PYTHONPATH=src python bench/overhead.py            # this tree
    PYTHONPATH=/path/to/older/src python bench/overhead.py   # a tree without them

It drives the worker's own `Runner._execute` (the code every claimed run goes through:
its handler looked up, its `JobContext` made and set, the handler awaited or run in a
thread, its ending decided and logged) for many runs of a no-op handler, with the
claim check stubbed out and nothing written, and prints the microseconds per run:

- `async`, `sync`: a no-op `async def` handler, and a no-op plain one (run in a thread);
- `async + 1 middleware`, `sync + 1 middleware`: with one pass-through middleware;
- `log record in a run` / `log record outside`: `Logger.makeRecord` inside a run (the
  job fields added) and outside one.

Run it once on a tree before the job context (the middleware and log rows are then
left out) and once on this one: the difference of the `async` rows is what the job
context and the log fields cost each run; the middleware rows add the chain's cost.
Each figure is the best of several rounds (the least disturbed by other work).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
import uuid
from typing import Any

from axa_queue import Queue, QueueOptions, logs
from axa_queue import context as job_context
from axa_queue.worker.runs import Runner
from axa_queue.worker.state import Run, State

JOB_FIELDS = hasattr(logs, "add_job_fields")
"""Whether this tree adds the job's fields to log records (absent before)."""


class NoClaims:
    """The claim checks a run makes before its handler starts: never in doubt here."""

    def doubtful(self, one: Run) -> bool:
        return False


def make_runs(name: str, count: int) -> list[Run]:
    return [Run(str(uuid.uuid4()), name, 1, 1, None, "{}", 0.0) for _ in range(count)]


async def per_run(runner: Runner, name: str, count: int, rounds: int) -> float:
    """The best, over `rounds`, of the microseconds per run of `count` runs of `name`."""
    best = float("inf")
    for _ in range(rounds):
        runs = make_runs(name, count)
        started = time.perf_counter()
        for one in runs:
            await runner._execute(one)
        best = min(best, (time.perf_counter() - started) / count * 1e6)
        runner.state.endings.clear()
    return best


def runner_of(queue: Queue) -> Runner:
    options = queue.options
    state = State(options.workers, options.prefetch)
    return Runner(state, NoClaims(), queue.registry, options, "bench")  # type: ignore[arg-type]


async def measure(count: int, rounds: int) -> dict[str, float]:
    plain = Queue("postgresql:///unused", QueueOptions(workers=1))
    wrapped = Queue("postgresql:///unused", QueueOptions(workers=1))
    for queue in (plain, wrapped):

        @queue.handler("Async")
        async def noop_async(args: Any) -> None:
            return None

        @queue.handler("Sync")
        def noop_sync(args: Any) -> None:
            return None

    results: dict[str, float] = {}
    has_middleware = hasattr(wrapped, "middleware")
    if has_middleware:

        @wrapped.middleware
        async def passing(job: Any, call_next: Any) -> Any:
            return await call_next()

    cases: list[tuple[str, Queue, str, int]] = [
        ("async", plain, "Async", count),
        ("sync", plain, "Sync", count // 10),
    ]
    if has_middleware:
        cases += [
            ("async + 1 middleware", wrapped, "Async", count),
            ("sync + 1 middleware", wrapped, "Sync", count // 10),
        ]
    runners = {id(q): runner_of(q) for q in (plain, wrapped)}
    for _ in range(2):  # interleaved, twice: each case's best over both passes
        for label, queue, name, n in cases:
            took = await per_run(runners[id(queue)], name, n, rounds)
            results[label] = min(results.get(label, took), took)
    for runner in runners.values():
        runner.executor.shutdown()
    if JOB_FIELDS:
        results.update(log_records(count, rounds))
    return results


def log_records(count: int, rounds: int) -> dict[str, float]:
    """Microseconds to make one log record, in a run and outside one."""
    logs.add_job_fields()
    logger = logging.getLogger("bench.library")
    job = job_context.fresh("Bench", 1)

    def best() -> float:
        fastest = float("inf")
        for _ in range(rounds):
            started = time.perf_counter()
            for _ in range(count):
                logger.makeRecord(logger.name, logging.INFO, __file__, 1, "hello", (), None)
            fastest = min(fastest, (time.perf_counter() - started) / count * 1e6)
        return fastest

    outside = best()
    token = job_context.enter(job)
    try:
        inside = best()
    finally:
        job_context.leave(token)
    return {"log record outside a run": outside, "log record in a run": inside}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20_000, help="runs per round (async)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    logging.getLogger("axa_queue").setLevel(logging.INFO)  # as a worker runs: no DEBUG lines
    results = asyncio.run(measure(args.runs, args.rounds))
    width = max(len(label) for label in results)
    for label, micros in results.items():
        print(f"{label:<{width}}  {micros:7.2f} µs")


if __name__ == "__main__":
    main()
