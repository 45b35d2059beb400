"""DSNs: what the library takes as "the database", and the one place it reads it.

A DSN is a libpq connection string (`host=db dbname=shop user=app`) or a URL. libpq
reads `postgresql://` and `postgres://` URLs; an application often holds a SQLAlchemy
URL instead, in `DATABASE_URL`: `postgresql+asyncpg://...`, `postgresql+psycopg://...`.
`normalized` reads those as the plain `postgresql://` URL (axa-queue connects with
psycopg, whatever driver the application uses) and refuses what no PostgreSQL driver
reads (`mysql://`, a driver it does not know, a query parameter libpq does not take)
with an `OptionsError` naming the scheme or the parameter, never the rest of the URL
(it may hold a password).

Every way a DSN enters the library goes through `normalized`: `Queue(...)`,
`SyncQueue(...)`, `open(dsn)` and their `dsn` (through `Connector`), the environment
(`options.dsn_from_environment`: `AXA_QUEUE_DSN`, then `DATABASE_URL`), the command
line's `--dsn` (`cli.conventions.checked_dsn`: every command, the dashboard, the demo),
and the test helpers' `AXA_TEST_DATABASE_URL`.

`as_url` goes the other way, for clients that take only URLs (SQLAlchemy): a libpq
connection string as the `postgresql://` URL that means the same.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ..errors import OptionsError

__all__ = ["DRIVERS", "SCHEMES", "as_url", "normalized"]

SCHEMES = ("postgresql", "postgres")
"""The URL schemes libpq reads itself."""

DRIVERS = ("asyncpg", "psycopg", "psycopg2", "psycopg2cffi", "psycopg_async", "pg8000", "aiopg")
"""The drivers a SQLAlchemy (or `databases`) URL may name after `postgresql+`: all reach
PostgreSQL, so their URLs are read as `postgresql://` URLs."""

SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
"""libpq's `sslmode` values, which asyncpg's URLs give as `ssl=` instead."""

_SCHEME = re.compile(r"\s*([A-Za-z][A-Za-z0-9+.\-]*)://")

_LIBPQ_KEYWORDS = frozenset(
    d.keyword.decode() for d in psycopg.pq.Conninfo.get_defaults() if d.keyword
)

_READ_AS = (
    "give a postgresql:// URL (SQLAlchemy's postgresql+DRIVER://, DRIVER one of "
    f"{', '.join(DRIVERS)}, is read as postgresql://) or a libpq connection string "
    "(key=value ...)"
)


def normalized(dsn: str, given: str = "the DSN given") -> str:
    """`dsn` as libpq reads it: a connection string as it is; a `postgresql://` or
    `postgres://` URL as it is; a `postgresql+DRIVER://` URL (a driver of `DRIVERS`) as
    `postgresql://`, its query read as SQLAlchemy reads it (`+` is a space), with
    asyncpg's `ssl=MODE` as libpq's `sslmode=MODE`. Raises an
    `OptionsError` starting with `given` (where the DSN came from) for another scheme
    or a query parameter libpq does not take, naming only the scheme or parameter."""
    found = _SCHEME.match(dsn)
    if found is None:
        return dsn  # a libpq connection string (key=value), or empty
    scheme = found[1].lower()
    base, plus, driver = scheme.partition("+")
    if base not in SCHEMES:
        raise OptionsError(
            f"{given} is a {found[1]}:// URL: axa-queue runs on PostgreSQL only; {_READ_AS}"
        )
    if plus and driver not in DRIVERS:
        raise OptionsError(
            f"{given} is a {found[1]}:// URL, whose driver {driver!r} axa-queue does not "
            f"know; {_READ_AS}"
        )
    rest = dsn[found.end() :]
    url = dsn.strip() if scheme in SCHEMES and found[1] == scheme else f"postgresql://{rest}"
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if plus:
        # The query as SQLAlchemy reads it (and writes it: `render_as_string` gives a
        # space as `+`), written again as libpq reads it (a space as %20; libpq takes
        # `+` as it is); asyncpg's `ssl=MODE` as libpq's `sslmode=MODE`.
        if driver == "asyncpg" and not any(key == "sslmode" for key, _ in query):
            query = [
                ("sslmode", value) if key == "ssl" and value in SSL_MODES else (key, value)
                for key, value in query
            ]
        if parts.query:
            url = urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))
    unknown = sorted({key for key, _ in query} - _LIBPQ_KEYWORDS)
    if unknown:
        raise OptionsError(
            f"{given} has URL parameters libpq does not take: {', '.join(unknown)} "
            "(axa-queue connects through libpq, whatever driver the URL names); give "
            "axa-queue a URL without them, in AXA_QUEUE_DSN, which is read before "
            "DATABASE_URL"
        )
    return url


def as_url(dsn: str) -> str:
    """The libpq connection string (or URL) `dsn` as a `postgresql://` URL meaning the
    same: user, password, host and port, database, and every other parameter (such as
    `options`) in the query, percent-encoded. A Unix socket's directory goes in the
    query (`?host=/run/postgresql`)."""
    parts: dict[str, object] = dict(conninfo_to_dict(normalized(dsn)))
    user = quote(str(parts.pop("user", "")), safe="")
    password = parts.pop("password", None)
    login = f"{user}:{quote(str(password), safe='')}@" if password else f"{user}@" if user else ""
    host = str(parts.pop("host", ""))
    port = parts.pop("port", None)
    if host.startswith("/") or "," in host:  # a socket's directory, or several hosts
        parts["host"], host = host, ""
    where = f"{_bracketed(host)}:{port}" if port and host else _bracketed(host)
    if port and not host:
        parts["port"] = port
    dbname = quote(str(parts.pop("dbname", "")), safe="")
    query = urlencode({key: str(value) for key, value in parts.items()}, quote_via=quote)
    return f"postgresql://{login}{where}/{dbname}" + (f"?{query}" if query else "")


def _bracketed(host: str) -> str:
    """An IPv6 address in brackets, as a URL's host is written."""
    return f"[{host}]" if ":" in host else host
