"""The metric of fairness by key (the `[metrics]` extra): for each name this process
claims by key (`Queue.limit_per_key`, `Queue.fair_by_key`), its jobs by key and state,
the busiest `TOP_KEYS` keys by name and every other key summed under `"other"`, so the
number of series stays bounded however many keys there are::

    axa_queue_key_jobs{job="Report",key="tenant-42",state="ready"} 12
    axa_queue_key_jobs{job="Report",key="other",state="ready"} 3051

Read by `QueueCollector` (`metrics`) with the other counts, in the background. A key is not
an argument, but it may name a customer: only keyed names' busiest keys are exported."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg
from prometheus_client.core import GaugeMetricFamily

from ..db.calls import run_async
from ..jobs.keys import KeyCounts, key_counts_call

__all__ = ["OTHER", "TOP_KEYS", "key_family", "read_keys"]

TOP_KEYS = 10
"""How many keys of a name are exported by name."""

OTHER = "other"
"""The `key` label of every key past the busiest `TOP_KEYS`, summed."""

_STATES = ("ready", "waiting", "running")


async def read_keys(
    conn: psycopg.AsyncConnection[Any], names: Iterable[str]
) -> dict[str, list[KeyCounts]]:
    """The busiest `TOP_KEYS` keys of each of `names`, on `conn` (one read each)."""
    return {name: await run_async(conn, key_counts_call(name, TOP_KEYS)) for name in names}


def key_family(snapshot: dict[str, list[KeyCounts]]) -> GaugeMetricFamily:
    """`axa_queue_key_jobs` of `snapshot` (a name's busiest keys, and `"other"`)."""
    family = GaugeMetricFamily(
        "axa_queue_key_jobs",
        f"Jobs of each job name claimed by key, by key and state (ready, waiting, running): "
        f'the {TOP_KEYS} busiest keys by name, every other key summed as key="{OTHER}".',
        labels=["job", "key", "state"],
    )
    for name, keys in sorted(snapshot.items()):
        for one in keys:
            for state in _STATES:
                family.add_metric([name, one.key, state], float(getattr(one, state)))
        if keys:
            for at, state in enumerate(_STATES):
                rest = keys[0].of_all[at] - sum(getattr(one, state) for one in keys)
                family.add_metric([name, OTHER, state], float(rest))
    return family
