"""Autovacuum as the server would run it, for a server whose own is off.

The PostgreSQL these benchmarks were written on runs with `autovacuum = off`, and a
benchmark must never change the server's settings. A sustained-load benchmark
(`bench/soak.py`) would then measure a table no production server has: never vacuumed,
never analyzed. `Autovacuum` does in the benchmark what autovacuum would do, for the
tables of one schema only (the benchmark's own):

- Every `autovacuum_naptime` (the server's, unless given) a worker starts, as the
  launcher starts one per naptime for a database, unless `autovacuum_max_workers` are
  still busy. It reads `pg_stat_user_tables` and `pg_class.reltuples` of the schema's
  tables and applies autovacuum's thresholds (`needs`): VACUUM when the dead rows pass
  `autovacuum_vacuum_threshold + autovacuum_vacuum_scale_factor * reltuples`, or the
  rows inserted since the last vacuum pass `autovacuum_vacuum_insert_threshold +
  autovacuum_vacuum_insert_scale_factor * reltuples` (unless that threshold is -1);
  ANALYZE when the rows changed since the last analyze pass
  `autovacuum_analyze_threshold + autovacuum_analyze_scale_factor * reltuples`. A
  table's own settings (`ALTER TABLE ... SET (autovacuum_vacuum_scale_factor = ...)`,
  in `pg_class.reloptions`) win over the server's; `autovacuum_enabled = false` leaves
  it alone. A `reltuples` of -1 (never vacuumed or analyzed) counts as 0, as
  autovacuum counts it.
- It runs `VACUUM (SKIP_LOCKED[, ANALYZE])` or `ANALYZE (SKIP_LOCKED)` of each such
  table in turn, skipping one another worker is on, on a connection of its own with
  autovacuum's cost settings: `vacuum_cost_delay` = `autovacuum_vacuum_cost_delay`
  (`vacuum_cost_delay` when -1), `vacuum_cost_limit` = `autovacuum_vacuum_cost_limit`
  (`vacuum_cost_limit` when -1), or the table's own; as autovacuum balances its cost
  limit across its workers, a table without cost settings of its own gets the limit
  divided by the workers busy at its start.

What it leaves out: anti-wraparound vacuums (a benchmark never gets near
`autovacuum_freeze_max_age`), TOAST tables on their own thresholds (a table's VACUUM
processes its TOAST table; a benchmark's jobs have none), and balancing again while a
run is in progress.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

SETTINGS = """SELECT name, setting FROM pg_settings
    WHERE name LIKE 'autovacuum%' OR name IN ('vacuum_cost_delay', 'vacuum_cost_limit')"""

TABLES = """SELECT c.relname AS name, c.reltuples AS reltuples, c.reloptions AS reloptions,
       s.n_dead_tup AS dead, s.n_ins_since_vacuum AS inserted,
       s.n_mod_since_analyze AS changed
    FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
    WHERE s.schemaname = %s AND c.relkind IN ('r', 'm')
    ORDER BY c.oid"""
"""The schema's tables (and materialized views) with what autovacuum's thresholds read;
partitioned tables are left out, as autovacuum leaves them."""

COST = """SELECT set_config('vacuum_cost_delay', %s, false),
                 set_config('vacuum_cost_limit', %s, false)"""
"""Autovacuum's cost settings for the session's VACUUM and ANALYZE."""


@dataclass(frozen=True)
class Settings:
    """The autovacuum settings that decide when and how a table is vacuumed."""

    naptime: float = 60.0
    max_workers: int = 3
    vacuum_threshold: float = 50
    vacuum_scale_factor: float = 0.2
    insert_threshold: float = 1000
    insert_scale_factor: float = 0.2
    analyze_threshold: float = 50
    analyze_scale_factor: float = 0.1
    cost_delay_ms: float = 2.0
    cost_limit: int = 200
    enabled: bool = True
    """`autovacuum_enabled` (a table's own); the server's `autovacuum` is not read here."""
    own_cost: bool = False
    """Whether the table has cost settings of its own (left out of the balancing)."""

    @classmethod
    def of_server(cls, conn: psycopg.Connection[Any]) -> Settings:
        """The server's settings, as autovacuum reads them."""
        got = {row[0]: row[1] for row in conn.execute(SETTINGS).fetchall()}
        delay = float(got["autovacuum_vacuum_cost_delay"])
        limit = int(got["autovacuum_vacuum_cost_limit"])
        return cls(
            naptime=float(got["autovacuum_naptime"]),
            max_workers=int(got["autovacuum_max_workers"]),
            vacuum_threshold=float(got["autovacuum_vacuum_threshold"]),
            vacuum_scale_factor=float(got["autovacuum_vacuum_scale_factor"]),
            insert_threshold=float(got["autovacuum_vacuum_insert_threshold"]),
            insert_scale_factor=float(got["autovacuum_vacuum_insert_scale_factor"]),
            analyze_threshold=float(got["autovacuum_analyze_threshold"]),
            analyze_scale_factor=float(got["autovacuum_analyze_scale_factor"]),
            cost_delay_ms=float(got["vacuum_cost_delay"]) if delay < 0 else delay,
            cost_limit=int(got["vacuum_cost_limit"]) if limit < 0 else limit,
        )

    def for_table(self, reloptions: Sequence[str] | None) -> Settings:
        """These settings with a table's own (`pg_class.reloptions`) in their place."""
        own = dict(option.split("=", 1) for option in reloptions or ())
        cost_delay = float(own.get("autovacuum_vacuum_cost_delay", -1))
        cost_limit = int(own.get("autovacuum_vacuum_cost_limit", -1))
        return Settings(
            naptime=self.naptime,
            max_workers=self.max_workers,
            vacuum_threshold=float(own.get("autovacuum_vacuum_threshold", self.vacuum_threshold)),
            vacuum_scale_factor=float(
                own.get("autovacuum_vacuum_scale_factor", self.vacuum_scale_factor)
            ),
            insert_threshold=float(
                own.get("autovacuum_vacuum_insert_threshold", self.insert_threshold)
            ),
            insert_scale_factor=float(
                own.get("autovacuum_vacuum_insert_scale_factor", self.insert_scale_factor)
            ),
            analyze_threshold=float(
                own.get("autovacuum_analyze_threshold", self.analyze_threshold)
            ),
            analyze_scale_factor=float(
                own.get("autovacuum_analyze_scale_factor", self.analyze_scale_factor)
            ),
            cost_delay_ms=self.cost_delay_ms if cost_delay < 0 else cost_delay,
            cost_limit=self.cost_limit if cost_limit < 0 else cost_limit,
            enabled=own.get("autovacuum_enabled", "true").lower() not in ("false", "off", "0"),
            own_cost=cost_delay >= 0 or cost_limit >= 0,
        )


@dataclass(frozen=True)
class Decision:
    """What autovacuum would do to one table now, and the figures it judged by."""

    vacuum: bool
    analyze: bool
    dead: int
    vacuum_at: float
    inserted: int
    insert_at: float | None
    """None when insert-driven vacuums are off (a threshold of -1)."""
    changed: int
    analyze_at: float


def needs(row: Mapping[str, Any], settings: Settings) -> Decision:
    """Autovacuum's decision for a table of `TABLES` (`relation_needs_vacanalyze` of
    PostgreSQL's autovacuum.c, but for wraparound), `settings` being the server's."""
    own = settings.for_table(row["reloptions"])
    reltuples = max(float(row["reltuples"]), 0.0)  # -1: never vacuumed nor analyzed
    vacuum_at = own.vacuum_threshold + own.vacuum_scale_factor * reltuples
    insert_at = (
        None
        if own.insert_threshold < 0
        else own.insert_threshold + own.insert_scale_factor * reltuples
    )
    analyze_at = own.analyze_threshold + own.analyze_scale_factor * reltuples
    dead, inserted, changed = int(row["dead"]), int(row["inserted"]), int(row["changed"])
    vacuum = own.enabled and (dead > vacuum_at or (insert_at is not None and inserted > insert_at))
    analyze = own.enabled and changed > analyze_at
    return Decision(vacuum, analyze, dead, vacuum_at, inserted, insert_at, changed, analyze_at)


@dataclass(frozen=True)
class Run:
    """One VACUUM or ANALYZE the emulated autovacuum ran."""

    at: float
    """`time.monotonic()` at its start."""
    table: str
    vacuum: bool
    analyze: bool
    seconds: float
    dead: int
    """The table's dead rows when it was judged."""
    cost_limit: int


@dataclass
class Autovacuum:
    """Autovacuum for the tables of `schema`, in threads, from `start` to `stop`."""

    dsn: str
    schema: str
    naptime: float | None = None
    """Seconds between workers' starts; None: the server's `autovacuum_naptime`."""
    application_name: str | None = None
    """The name its sessions show in pg_stat_activity."""
    runs: list[Run] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._busy: set[str] = set()
        self._workers: list[threading.Thread] = []
        self._balanced = 0
        self._connections: set[psycopg.Connection[dict[str, Any]]] = set()
        self._launcher: threading.Thread | None = None
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            server = Settings.of_server(conn)
        self.settings = (
            server if self.naptime is None else dataclasses.replace(server, naptime=self.naptime)
        )

    def start(self) -> None:
        self._launcher = threading.Thread(target=self._launch, name="autovacuum", daemon=True)
        self._launcher.start()

    def stop(self) -> None:
        """Stop launching; cancel the statements in progress; wait for the workers."""
        self._stop.set()
        with self._lock:
            for conn in self._connections:
                with contextlib.suppress(psycopg.Error):
                    conn.cancel_safe()
        if self._launcher is not None:
            self._launcher.join()
        for worker in self._workers:
            worker.join()

    @contextlib.contextmanager
    def running(self) -> Iterator[Autovacuum]:
        self.start()
        try:
            yield self
        finally:
            self.stop()

    def _launch(self) -> None:
        while not self._stop.wait(self.settings.naptime):
            self._workers = [w for w in self._workers if w.is_alive()]
            if len(self._workers) >= self.settings.max_workers:
                continue
            worker = threading.Thread(target=self.work, name="autovacuum worker", daemon=True)
            self._workers.append(worker)
            worker.start()

    def _connect(self) -> psycopg.Connection[dict[str, Any]]:
        name = self.application_name
        dsn = self.dsn if name is None else make_conninfo(self.dsn, application_name=name)
        return psycopg.connect(dsn, autocommit=True, row_factory=dict_row)

    def work(self) -> None:
        """One worker's pass: each table that needs it, in turn (judged again just
        before, as autovacuum's workers do), but those another worker is on. The
        launcher runs one in a thread every naptime; a caller may run one itself."""
        try:
            with self._connect() as conn:
                with self._lock:
                    self._connections.add(conn)
                try:
                    for name in [row["name"] for row in conn.execute(TABLES, (self.schema,))]:
                        if self._stop.is_set():
                            return
                        self._one(conn, name)
                finally:
                    with self._lock:
                        self._connections.discard(conn)
        except psycopg.errors.QueryCanceled:
            if not self._stop.is_set():
                self.errors.append("a vacuum was cancelled")
        except psycopg.Error as error:
            if not self._stop.is_set():
                self.errors.append(f"{type(error).__name__}: {error}")

    def _one(self, conn: psycopg.Connection[dict[str, Any]], name: str) -> None:
        rows = conn.execute(TABLES, (self.schema,)).fetchall()
        row = next((r for r in rows if r["name"] == name), None)
        if row is None:
            return
        decision = needs(row, self.settings)
        if not (decision.vacuum or decision.analyze):
            return
        own = self.settings.for_table(row["reloptions"])
        with self._lock:
            if name in self._busy:
                return
            self._busy.add(name)
            if not own.own_cost:
                self._balanced += 1
            sharing = max(self._balanced, 1)
        limit = own.cost_limit if own.own_cost else max(own.cost_limit // sharing, 1)
        try:
            conn.execute(COST, (f"{own.cost_delay_ms}ms", str(limit)))
            table = sql.Identifier(self.schema, name)
            if decision.vacuum:
                options = sql.SQL("SKIP_LOCKED, ANALYZE" if decision.analyze else "SKIP_LOCKED")
                statement = sql.SQL("VACUUM ({}) {}").format(options, table)
            else:
                statement = sql.SQL("ANALYZE (SKIP_LOCKED) {}").format(table)
            started = time.monotonic()
            conn.execute(statement)
            self.runs.append(
                Run(
                    started,
                    name,
                    decision.vacuum,
                    decision.analyze,
                    time.monotonic() - started,
                    decision.dead,
                    limit,
                )
            )
        finally:
            with self._lock:
                self._busy.discard(name)
                if not own.own_cost:
                    self._balanced -= 1
