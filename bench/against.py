"""This tree against another commit, side by side in one run: `bench/run.py`'s drain
(`drain_axa`: pre-queued jobs whose handler writes its row on the connection its run is
lent, 10 loops a process or as `--loops` says, the library's defaults) and its latency
(`latency_axa`: enqueue to start, one job every 5 ms), each tree running its own
`bench/run.py` and its own library in a fresh Python process, the trees alternated (the
other first in even pairs, this one first in odd ones), medians and ratios printed.

    python bench/against.py --ref 5ce29cb
    python bench/against.py --ref 5ce29cb --pairs 8 --processes 1,2 --latency-samples 400
    python bench/against.py --ref 5ce29cb --together --loops 1,10 --latency-samples 0

The other tree is checked out with `git worktree` into a temporary directory, removed
afterwards; both trees use the packages installed here (psycopg and the rest). On a
shared, noisy machine (a VM whose rounds move by 10 to 30%), take many pairs and read
the spread as well as the medians: a bound of a few percent is shown only by pairs that
agree. With five pairs or more, each row also prints the median of its pairs' ratios
and a 90% interval for it (`interval`: the pairs resampled with replacement), how far
that median could move by the pairs' chance alone; run `--ref HEAD` (this tree against
itself) to see what the method reads for no difference at all.

With `--together`, each pair runs the two trees at the same time instead of one after
the other: both processes set up first (schema, jobs queued, pool warm; for the
latency, the worker idle and listening), say so, and are released together, so what
the machine's drifting speed does to one it does to the other. The drain (one process
of 10 loops each) is then the rate of endings over `--window` seconds, from `--settle`
seconds after the release, while both still run (give `--jobs` enough for neither to
finish first); the latency, the same samples enqueued side by side. Each side then has
half the machine: the ratio says which tree does a job with less of it. Both sides' pools
are open at once: with `--loops 50`, 54 connections a side, more than a server of 100
`max_connections` takes (run 50 loops one tree after the other there).

    python bench/against.py --ref 5ce29cb --together --pairs 12 --jobs 40000

`--enqueue-jobs N` adds `bench/run.py`'s enqueue figures: `N` single `enqueue` calls one
after the other (`enqueue_single`), then one `enqueue_all` of `N` jobs
(`enqueue_bulk`). With `--together`, the single enqueues are counted over `--window`
seconds from the release, then both sides queue their `enqueue_all` at once.

    python bench/against.py --ref 5ce29cb --together --pairs 12 --processes '' \
        --latency-samples 0 --enqueue-jobs 10000

`--integration-jobs N` adds the integrations' figures: `N` jobs queued on each kind of
connection `bench/integrations.py` measures (psycopg's, Django's, SQLAlchemy's,
asyncpg's), one by one and 100 at a time, and compares the client's CPU time per job
(the library, the integration, the driver), which the machine's drift barely moves.
One tree after the other only.

    python bench/against.py --ref 5ce29cb --pairs 6 --processes '' --latency-samples 0 \
        --integration-jobs 2000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

CASE = """
import json, sys
import run
kind, dsn, size, processes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
loops = int(sys.argv[5])
if kind == "drain":
    drained = run.drain_axa(dsn, size, loops, processes)
    print(json.dumps({"jobs/s": drained.jobs_per_s}))
elif kind == "enqueue":
    single = run.enqueue_single(dsn, size, "axa")
    print(json.dumps({"single/s": single, "bulk/s": run.enqueue_bulk(dsn, size, "axa")}))
elif kind == "integrations":
    figures = {}
    for through in run.integrations.KINDS:
        for batch in (1, 100):
            rate = run.enqueue_through(dsn, through, size, batch)
            figures[f"{through} x{batch} cpu us"] = rate.cpu_us_per_job
    print(json.dumps(figures))
else:
    latency = run.latency_axa(dsn, size)
    print(json.dumps({"p50 ms": latency.p50_ms, "p99 ms": latency.p99_ms}))
"""
"""One case in a tree's own process: its `bench/run.py` and library (on `PYTHONPATH`)."""

CASE_TOGETHER = """
import asyncio, json, os, sys, time, uuid
import run
kind, dsn, size, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
settle, window, loops = float(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7])

async def released():
    open(go + "." + str(os.getpid()), "w").close()
    while not os.path.exists(go):
        await asyncio.sleep(0.002)

async def drain(sdsn):
    queue = run.bench_queue(sdsn, loops)
    await queue.open()
    try:
        await run.queue_jobs(queue, size)
        run.prepare_for_timing(sdsn)
        await run.warm_pool(queue)
        ended = 0
        def seen(_name, _outcome, _seconds):
            nonlocal ended
            ended += 1
        queue.observe(seen)
        await released()
        stop = asyncio.Event()
        running = asyncio.ensure_future(queue.run(stop))
        await asyncio.sleep(settle)
        first, t1 = ended, time.monotonic()
        await asyncio.sleep(window)
        last, t2 = ended, time.monotonic()
        stop.set()
        await running
        if last >= size:
            raise SystemExit(f"all {size} jobs ended inside the window: give more --jobs")
        return {"jobs/s": (last - first) / (t2 - t1)}
    finally:
        await queue.close()

async def enqueue(sdsn):
    from axa_queue import NewJob, Queue
    async with Queue(sdsn) as queue:
        for _ in range(20):
            await queue.enqueue(run.JOB, {"k": str(uuid.uuid4())})
        args = [{"k": str(uuid.uuid4())} for _ in range(size)]
        await released()
        done, t0 = 0, time.perf_counter()
        while done < size and time.perf_counter() - t0 < window:
            await queue.enqueue(run.JOB, args[done])
            done += 1
        single = done / (time.perf_counter() - t0)
        t1 = time.perf_counter()
        await queue.enqueue_all([NewJob(run.JOB, one) for one in args])
        return {"single/s": single, "bulk/s": size / (time.perf_counter() - t1)}

if kind == "drain":
    with run.scratch_schema(dsn) as sdsn:
        run.setup_tables(sdsn)
        print(json.dumps(asyncio.run(drain(sdsn))))
elif kind == "enqueue":
    with run.scratch_schema(dsn) as sdsn:
        run.setup_tables(sdsn, done_table=False)
        run.prepare_for_timing(sdsn)
        print(json.dumps(asyncio.run(enqueue(sdsn))))
else:
    gated = run._Producer.run
    async def run_released(self, timeout):
        await released()
        return await gated(self, timeout)
    run._Producer.run = run_released
    latency = run.latency_axa(dsn, size)
    print(json.dumps({"p50 ms": latency.p50_ms, "p99 ms": latency.p99_ms}))
"""
"""One side of a case run with `--together`, in a tree's own process: set up, say it is
ready (a file `<go>.<pid>`), wait for the file `go`, measure. The latency's gate is
its producer's start (`run._Producer.run`, in both trees): the worker is idle and
listening by then. The enqueue's: a queue open and 20 jobs queued (its connection
made); then single `enqueue` calls for `window` seconds (or `size` calls, if fewer),
and one `enqueue_all` of `size` jobs, each side timing its own."""


def checkout(ref: str, where: str) -> None:
    """Check `ref` out into the new directory `where` (`git worktree add --detach`)."""
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", where, ref],
        check=True,
        capture_output=True,
    )


def remove(where: str) -> None:
    """Remove the worktree at `where`, and git's record of it."""
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "remove", "--force", where], capture_output=True
    )
    subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True)


def measure(
    tree: Path, kind: str, dsn: str, size: int, processes: int, loops: int = 10
) -> dict[str, float]:
    """One case run by `tree`'s code: its figures by name."""
    done = subprocess.run(
        [sys.executable, "-c", CASE, kind, dsn, str(size), str(processes), str(loops)],
        cwd=tree,
        env=_env(tree),
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{kind} in {tree} failed:\n{done.stderr[-2000:]}")
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def _env(tree: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree / "src"), str(tree / "bench")]))


def measure_together(
    trees: dict[str, Path],
    kind: str,
    dsn: str,
    size: int,
    settle: float,
    window: float,
    loops: int = 10,
) -> dict[str, dict[str, float]]:
    """One case run by every tree at once (`CASE_TOGETHER`), released together once all
    are set up: each tree's figures by name. Each side writes to files of its own, so
    none can stall on a full pipe while the other gets ready."""
    with tempfile.TemporaryDirectory(prefix="axa-together-") as gates:
        go = Path(gates) / "go"
        args = [kind, dsn, str(size), str(go), str(settle), str(window), str(loops)]
        sides: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for at, (name, tree) in enumerate(trees.items()):
                with (
                    open(Path(gates) / f"out{at}", "wb") as out,
                    open(Path(gates) / f"err{at}", "wb") as err,
                ):
                    sides[name] = subprocess.Popen(
                        [sys.executable, "-c", CASE_TOGETHER, *args],
                        cwd=tree,
                        env=_env(tree),
                        stdout=out,
                        stderr=err,
                    )

            def said(at: int, what: str) -> str:
                return (Path(gates) / f"{what}{at}").read_text(errors="replace")

            deadline = time.monotonic() + 600
            while len(list(Path(gates).glob("go.*"))) < len(sides):
                failed = [at for at, side in enumerate(sides.values()) if side.poll() is not None]
                if failed or time.monotonic() > deadline:
                    why = "\n".join(said(at, "err")[-2000:] for at in failed)
                    raise RuntimeError(f"{kind}: a side did not get ready\n{why}")
                time.sleep(0.01)
            go.touch()
            figures: dict[str, dict[str, float]] = {}
            for at, (name, side) in enumerate(sides.items()):
                if side.wait(timeout=900) != 0:
                    raise RuntimeError(
                        f"{kind} in {trees[name]} failed:\n{said(at, 'err')[-2000:]}"
                    )
                figures[name] = json.loads(said(at, "out").strip().splitlines()[-1])
            return figures
        finally:
            for side in sides.values():
                if side.poll() is None:
                    side.kill()
                    side.wait()


def main(argv: list[str] | None = None) -> dict[str, dict[str, list[float]]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://root@127.0.0.1:5432/postgres")
    parser.add_argument("--ref", required=True, help="the commit to compare with, e.g. 5ce29cb")
    parser.add_argument("--pairs", type=int, default=6, help="rounds of each tree (default 6)")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    parser.add_argument(
        "--processes", help="worker processes of each drain (default 1,2; 1 with --together)"
    )
    parser.add_argument(
        "--loops", default="10", help="loops of each drain's process, e.g. 1,10,50 (default 10)"
    )
    parser.add_argument("--latency-samples", type=int, default=400, help="0: no latency")
    parser.add_argument(
        "--integration-jobs",
        type=int,
        default=0,
        help="jobs queued through each kind of connection, one by one and 100 at a time, "
        "the client's CPU per job compared (0: none; not with --together)",
    )
    parser.add_argument(
        "--enqueue-jobs",
        type=int,
        default=0,
        help="jobs of the enqueue case: single enqueues and one enqueue_all (0: none)",
    )
    parser.add_argument(
        "--together", action="store_true", help="run the two trees at once, released together"
    )
    parser.add_argument("--settle", type=float, default=1.0, help="--together: before the window")
    parser.add_argument("--window", type=float, default=5.0, help="--together: drain's window (s)")
    given = parser.parse_args(argv)
    default = "1" if given.together else "1,2"
    chosen = default if given.processes is None else given.processes
    processes = [int(one) for one in chosen.split(",") if one]
    if given.together and processes not in ([], [1]):
        parser.error("--together drains with one process of each tree: --processes 1 (or '')")
    cases: list[tuple[str, str, int, int, int]] = [
        (f"drain {p} x {n}", "drain", given.jobs, p, n)
        for p in processes
        for n in [int(one) for one in given.loops.split(",") if one]
    ]
    if given.latency_samples:
        cases.append(("latency", "latency", given.latency_samples, 1, 10))
    if given.enqueue_jobs:
        cases.append(("enqueue", "enqueue", given.enqueue_jobs, 1, 10))
    if given.integration_jobs:
        if given.together:
            parser.error("--integration-jobs runs one tree after the other: not with --together")
        cases.append(("integrations", "integrations", given.integration_jobs, 1, 10))
    # figures[case label][tree][figure name] = one value per pair
    figures: dict[str, dict[str, dict[str, list[float]]]] = {}
    with tempfile.TemporaryDirectory(prefix="axa-against-") as scratch:
        other = Path(scratch) / "tree"
        checkout(given.ref, str(other))
        try:
            trees = {given.ref: other, "this tree": ROOT}
            for pair in range(given.pairs):
                order = list(trees) if pair % 2 == 0 else list(reversed(trees))
                for label, kind, size, count, loops in cases:
                    if given.together:
                        both = {name: trees[name] for name in order}
                        each = measure_together(
                            both, kind, given.dsn, size, given.settle, given.window, loops
                        )
                    else:
                        each = {
                            name: measure(trees[name], kind, given.dsn, size, count, loops)
                            for name in order
                        }
                    for name, got in each.items():
                        by_tree = figures.setdefault(label, {}).setdefault(name, {})
                        for figure, value in got.items():
                            by_tree.setdefault(figure, []).append(value)
                        print(f"pair {pair + 1} {label} {name}: {_shown(got)}", file=sys.stderr)
        finally:
            remove(str(other))
    print(
        f"{'case':<16} {'figure':<8} {given.ref:>12} {'this tree':>12} {'ratio':>7}  "
        f"{'pairs: median [90%]':<22}  pairs"
    )
    summary: dict[str, dict[str, list[float]]] = {}
    for label, by_tree in figures.items():
        for figure in by_tree[given.ref]:
            theirs = by_tree[given.ref][figure]
            ours = by_tree["this tree"][figure]
            ratio = _ratio(statistics.median(ours), statistics.median(theirs))
            per_pair = [_ratio(o, t) for o, t in zip(ours, theirs, strict=True)]
            summary[f"{label} {figure}"] = {"ref": theirs, "this": ours}
            spread = interval(per_pair)
            middle = (
                ""
                if spread is None
                else f"{statistics.median(per_pair):.3f} [{spread[0]:.3f}, {spread[1]:.3f}]"
            )
            print(
                f"{label:<16} {figure:<8} {statistics.median(theirs):>12,.2f} "
                f"{statistics.median(ours):>12,.2f} {ratio:>7.3f}  {middle:<22}  "
                + ", ".join(f"{one:.2f}" for one in per_pair)
            )
    return summary


def interval(ratios: list[float], rounds: int = 2000) -> tuple[float, float] | None:
    """A 90% interval for the median of the pairs' `ratios`: the 5th and 95th
    percentiles of the medians of `rounds` resamples of them, drawn with replacement
    with a fixed seed (the same pairs print the same interval). None under five
    pairs, too few to say anything by."""
    usable = [one for one in ratios if not math.isnan(one)]
    if len(usable) < 5:
        return None
    draw = random.Random(0)
    medians = sorted(statistics.median(draw.choices(usable, k=len(usable))) for _ in range(rounds))
    return medians[rounds * 5 // 100], medians[rounds * 95 // 100 - 1]


def _ratio(ours: float, theirs: float) -> float:
    return ours / theirs if theirs else math.nan


def _shown(got: dict[str, Any]) -> str:
    return ", ".join(f"{name} {value:,.2f}" for name, value in got.items())


if __name__ == "__main__":
    main()
