"""Enqueue through each integration, next to plain psycopg: what accepting Django's,
SQLAlchemy's and asyncpg's connections costs.

    python bench/integrations.py --dsn postgresql://root@127.0.0.1:5432/test [--quick]

is `bench/run.py --only integrations`: the cases are the `integrations` workload of
`bench/run.py`, interleaved with the others there. Each kind of
connection queues jobs with `enqueue_on` (single) and `enqueue_all_on` (batch), in the
caller's open transaction, committed at the end (the commit is timed too):

- single: `jobs` sequential `enqueue_on` calls, each awaited before the next;
- batch: `enqueue_all_on` of `batch` jobs, `jobs // batch` times.

Kinds: psycopg `Connection` and `AsyncConnection` (the baselines), Django's
`connections[alias]` (in `transaction.atomic`; as Django sets it up by default, binding
parameters in the client and preparing nothing, and `prepared`, with
`server_side_binding` and `prepare_threshold` as psycopg's own connection has them), a SQLAlchemy `Session`, an
`AsyncSession` on `postgresql+psycopg` and on `postgresql+asyncpg`, and an asyncpg
`Connection` (in `conn.transaction()`). A sync kind is compared with psycopg's sync
connection, an async one with psycopg's `AsyncConnection`: the ratio is the
integration's rate over psycopg's, 1.00 costing nothing. Each case runs in a schema of
its own (a DSN with `options=-c search_path=...`), after a warm-up of the same calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from axa_queue import NewJob, enqueue_all_on, enqueue_on

SYNC_KINDS = ("psycopg", "django", "django prepared", "sqlalchemy")
ASYNC_KINDS = ("psycopg async", "sqlalchemy async", "sqlalchemy asyncpg", "asyncpg")
KINDS = SYNC_KINDS + ASYNC_KINDS
"""Every kind measured; the first of each group is its baseline."""
BASELINE = {kind: "psycopg" for kind in SYNC_KINDS} | {k: "psycopg async" for k in ASYNC_KINDS}


@dataclass(frozen=True)
class Rate:
    """What one case measured."""

    jobs_per_s: float
    cpu_us_per_job: float
    """This process's CPU time per job (the benchmark's client: the library, the
    integration, the driver), which other work on the machine barely moves, unlike
    jobs/s: the integration's own cost shows here."""


@dataclass(frozen=True)
class Opened:
    """A connection of one kind in its caller's transaction, and how to commit it."""

    conn: Any
    commit: Callable[[], Any]


def _search_path(dsn: str) -> str:
    options = str(conninfo_to_dict(dsn).get("options", ""))
    return options.partition("search_path=")[2].split()[0] if "search_path=" in options else ""


def asyncpg_kwargs(dsn: str) -> dict[str, Any]:
    """asyncpg's connect arguments for the conninfo `dsn` (asyncpg takes no conninfo)."""
    parts = conninfo_to_dict(dsn)
    return {
        "host": parts.get("host"),
        "port": int(parts.get("port", 5432)),
        "user": parts.get("user"),
        "password": parts.get("password"),
        "database": parts.get("dbname"),
        "server_settings": {"search_path": _search_path(dsn)},
    }


def _django(dsn: str, prepared: bool = False) -> Any:
    """`connections[alias]` of a Django project whose database is `dsn`: as Django sets
    it up by default (parameters bound in the client, nothing prepared: safe behind
    any pooler), or `prepared` (`server_side_binding`, `prepare_threshold` 5, as
    psycopg's own connection does)."""
    import django
    from django.conf import settings
    from django.db import connections

    if not settings.configured:
        settings.configure(DATABASES={}, USE_TZ=True, INSTALLED_APPS=[])
        django.setup()
    parts = conninfo_to_dict(dsn)
    alias = f"bench_{_search_path(dsn)}{'_prepared' if prepared else ''}"
    options: dict[str, Any] = {"options": str(parts.get("options", ""))}
    if prepared:
        options |= {"server_side_binding": True, "prepare_threshold": 5}
    connections.settings[alias] = connections.configure_settings(
        {
            "default": {},
            alias: {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": parts.get("dbname", ""),
                "USER": parts.get("user", ""),
                "PASSWORD": parts.get("password", ""),
                "HOST": parts.get("host", ""),
                "PORT": str(parts.get("port", "")),
                "OPTIONS": options,
            },
        }
    )[alias]
    return connections[alias]


@contextlib.contextmanager
def opened_sync(kind: str, dsn: str) -> Iterator[Opened]:
    """A sync connection of `kind` to `dsn`, in a transaction that `commit` ends."""
    if kind == "psycopg":
        with psycopg.connect(dsn) as conn:
            yield Opened(conn, conn.commit)
    elif kind in ("django", "django prepared"):
        from django.db import transaction

        connection = _django(dsn, prepared=kind == "django prepared")
        try:
            block = transaction.atomic(using=connection.alias)
            block.__enter__()
            yield Opened(connection, lambda: block.__exit__(None, None, None))
        finally:
            connection.close()
    elif kind == "sqlalchemy":
        import sqlalchemy
        from sqlalchemy.orm import Session

        engine = sqlalchemy.create_engine(
            "postgresql+psycopg://", creator=lambda: psycopg.connect(dsn)
        )
        try:
            with Session(engine) as session:
                yield Opened(session, session.commit)
        finally:
            engine.dispose()
    else:
        raise ValueError(f"unknown sync kind {kind!r}; expected one of {', '.join(SYNC_KINDS)}")


@contextlib.asynccontextmanager
async def opened_async(kind: str, dsn: str) -> AsyncIterator[Opened]:
    """An async connection of `kind` to `dsn`, in a transaction that `commit` ends."""
    if kind == "psycopg async":
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            yield Opened(aconn, aconn.commit)
    elif kind in ("sqlalchemy async", "sqlalchemy asyncpg"):
        from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

        if kind == "sqlalchemy async":
            aengine = create_async_engine(
                "postgresql+psycopg://",
                async_creator=lambda: psycopg.AsyncConnection.connect(dsn),
            )
        else:
            aengine = create_async_engine("postgresql+asyncpg://", connect_args=asyncpg_kwargs(dsn))
        try:
            async with AsyncSession(aengine) as asession:
                yield Opened(asession, asession.commit)
        finally:
            await aengine.dispose()
    elif kind == "asyncpg":
        import asyncpg

        raw = await asyncpg.connect(**asyncpg_kwargs(dsn))
        try:
            transaction = raw.transaction()
            await transaction.start()
            yield Opened(raw, transaction.commit)
        finally:
            await raw.close()
    else:
        raise ValueError(f"unknown async kind {kind!r}; expected one of {', '.join(ASYNC_KINDS)}")


def _chunks(args: list[dict[str, Any]], batch: int) -> list[list[dict[str, Any]]]:
    return [args[start : start + batch] for start in range(0, len(args), batch)]


def _enqueue_sync(kind: str, dsn: str, jobs: int, batch: int, warmup: int) -> Rate:
    args = [{"k": str(i)} for i in range(jobs)]
    with opened_sync(kind, dsn) as case:
        for i in range(warmup):  # prepared statements, caches: as in a process running a while
            enqueue_on(case.conn, NewJob("warm", {"k": i}))
            enqueue_all_on(case.conn, [NewJob("warm")] * min(batch, 10))
        t0, c0 = time.perf_counter(), time.process_time()
        if batch == 1:
            for one in args:
                enqueue_on(case.conn, NewJob("noop", one))
        else:
            for chunk in _chunks(args, batch):
                enqueue_all_on(case.conn, [NewJob("noop", one) for one in chunk])
        case.commit()
        return Rate(jobs / (time.perf_counter() - t0), (time.process_time() - c0) / jobs * 1e6)


async def _enqueue_async(kind: str, dsn: str, jobs: int, batch: int, warmup: int) -> Rate:
    args = [{"k": str(i)} for i in range(jobs)]
    async with opened_async(kind, dsn) as case:
        for i in range(warmup):
            await enqueue_on(case.conn, NewJob("warm", {"k": i}))
            await enqueue_all_on(case.conn, [NewJob("warm")] * min(batch, 10))
        t0, c0 = time.perf_counter(), time.process_time()
        if batch == 1:
            for one in args:
                await enqueue_on(case.conn, NewJob("noop", one))
        else:
            for chunk in _chunks(args, batch):
                await enqueue_all_on(case.conn, [NewJob("noop", one) for one in chunk])
        await case.commit()
        return Rate(jobs / (time.perf_counter() - t0), (time.process_time() - c0) / jobs * 1e6)


def enqueue_rate(kind: str, dsn: str, jobs: int, batch: int = 1, warmup: int = 20) -> Rate:
    """Jobs/s and client CPU per job of queuing `jobs` jobs on a connection of `kind` to `dsn` (the tables must
    be there) in one transaction, commit included; `batch` > 1 queues them with
    `enqueue_all_on`, `batch` at a time. Sync kinds run outside any event loop."""
    if kind in SYNC_KINDS:
        return _enqueue_sync(kind, dsn, jobs, batch, warmup)
    return asyncio.run(_enqueue_async(kind, dsn, jobs, batch, warmup))


def main(argv: Sequence[str] | None = None) -> int:
    """`bench/run.py --only integrations` with the same options."""
    import run as bench  # bench/run.py, beside this file

    return bench.main(["--only", "integrations", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
