"""This tree against another commit, side by side in one run: `bench/run.py`'s drain
(`drain_axa`: pre-queued jobs whose handler writes its row on the connection its run is
lent, 10 loops a process, the library's defaults) and its latency (`latency_axa`:
enqueue to start, one job every 5 ms), each tree running its own `bench/run.py` and its
own library in a fresh Python process, the trees alternated (the other first in even
pairs, this one first in odd ones), medians and ratios printed.

    python bench/against.py --ref 5ce29cb
    python bench/against.py --ref 5ce29cb --pairs 8 --processes 1,2 --latency-samples 400

The other tree is checked out with `git worktree` into a temporary directory, removed
afterwards; both trees use the packages installed here (psycopg and the rest). On a
shared, noisy machine (a VM whose rounds move by 10 to 30%), take many pairs and read
the spread as well as the medians: a bound of a few percent is shown only by pairs that
agree.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

CASE = """
import json, sys
import run
kind, dsn, size, processes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if kind == "drain":
    drained = run.drain_axa(dsn, size, 10, processes)
    print(json.dumps({"jobs/s": drained.jobs_per_s}))
else:
    latency = run.latency_axa(dsn, size)
    print(json.dumps({"p50 ms": latency.p50_ms, "p99 ms": latency.p99_ms}))
"""
"""One case in a tree's own process: its `bench/run.py` and library (on `PYTHONPATH`)."""


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


def measure(tree: Path, kind: str, dsn: str, size: int, processes: int) -> dict[str, float]:
    """One case run by `tree`'s code: its figures by name."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree / "src"), str(tree / "bench")]))
    done = subprocess.run(
        [sys.executable, "-c", CASE, kind, dsn, str(size), str(processes)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{kind} in {tree} failed:\n{done.stderr[-2000:]}")
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def main(argv: list[str] | None = None) -> dict[str, dict[str, list[float]]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://root@127.0.0.1:5432/postgres")
    parser.add_argument("--ref", required=True, help="the commit to compare with, e.g. 5ce29cb")
    parser.add_argument("--pairs", type=int, default=6, help="rounds of each tree (default 6)")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    parser.add_argument("--processes", default="1,2", help="worker processes of each drain")
    parser.add_argument("--latency-samples", type=int, default=400, help="0: no latency")
    given = parser.parse_args(argv)
    cases: list[tuple[str, str, int, int]] = [
        (f"drain {p} x 10", "drain", given.jobs, p)
        for p in (int(one) for one in given.processes.split(",") if one)
    ]
    if given.latency_samples:
        cases.append(("latency", "latency", given.latency_samples, 1))
    # figures[case label][tree][figure name] = one value per pair
    figures: dict[str, dict[str, dict[str, list[float]]]] = {}
    with tempfile.TemporaryDirectory(prefix="axa-against-") as scratch:
        other = Path(scratch) / "tree"
        checkout(given.ref, str(other))
        try:
            trees = {given.ref: other, "this tree": ROOT}
            for pair in range(given.pairs):
                order = list(trees) if pair % 2 == 0 else list(reversed(trees))
                for label, kind, size, processes in cases:
                    for name in order:
                        got = measure(trees[name], kind, given.dsn, size, processes)
                        by_tree = figures.setdefault(label, {}).setdefault(name, {})
                        for figure, value in got.items():
                            by_tree.setdefault(figure, []).append(value)
                        print(f"pair {pair + 1} {label} {name}: {_shown(got)}", file=sys.stderr)
        finally:
            remove(str(other))
    print(f"{'case':<16} {'figure':<8} {given.ref:>12} {'this tree':>12} {'ratio':>7}  pairs")
    summary: dict[str, dict[str, list[float]]] = {}
    for label, by_tree in figures.items():
        for figure in by_tree[given.ref]:
            theirs = by_tree[given.ref][figure]
            ours = by_tree["this tree"][figure]
            ratio = statistics.median(ours) / statistics.median(theirs)
            per_pair = [o / t for o, t in zip(ours, theirs, strict=True)]
            summary[f"{label} {figure}"] = {"ref": theirs, "this": ours}
            print(
                f"{label:<16} {figure:<8} {statistics.median(theirs):>12,.2f} "
                f"{statistics.median(ours):>12,.2f} {ratio:>7.3f}  "
                + ", ".join(f"{one:.2f}" for one in per_pair)
            )
    return summary


def _shown(got: dict[str, Any]) -> str:
    return ", ".join(f"{name} {value:,.2f}" for name, value in got.items())


if __name__ == "__main__":
    main()
