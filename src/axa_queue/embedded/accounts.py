"""Running PostgreSQL for root: the unprivileged user that runs it, and what it may reach.

PostgreSQL refuses to run as root, so when this process is root ``initdb`` and
``postgres`` run as an `Account` (``nobody`` unless ``run_as`` says otherwise). This
module looks that user up, tells whether it can reach into a directory, and makes the
private directories it owns. It never changes the permissions of an existing folder.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from .install import EmbeddedPostgresError


@dataclass(frozen=True)
class Account:
    """The unprivileged system user that runs PostgreSQL when this process is root."""

    name: str
    uid: int
    gid: int


def running_as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def account_named(name: str) -> Account:
    """The unprivileged user ``name``; refused if it does not exist or is root."""
    import pwd  # POSIX only; install.site_root() has already refused other systems

    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise EmbeddedPostgresError(
            f"PostgreSQL refuses to run as root, and the user {name!r} meant to run it "
            "instead does not exist: pass run_as='<an existing unprivileged user>' "
            "or create one (useradd --system axa-queue-pg)"
        ) from None
    if entry.pw_uid == 0:
        raise EmbeddedPostgresError(
            f"run_as={name!r} is root; PostgreSQL refuses to run as root: name an unprivileged user"
        )
    return Account(name=name, uid=entry.pw_uid, gid=entry.pw_gid)


def can_traverse(path: Path, account: Account) -> bool:
    """Whether ``account`` (with no supplementary groups) can reach into ``path``."""
    for directory in (path, *path.parents):
        info = directory.stat()
        if info.st_uid == account.uid:
            bit = stat.S_IXUSR
        elif info.st_gid == account.gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not info.st_mode & bit:
            return False
    return True


def make_private_dir(path: Path, account: Account | None) -> None:
    """Make ``path`` (mode 0700), owned by ``account`` when there is one."""
    path.mkdir(mode=0o700)
    path.chmod(0o700)
    if account is not None:
        os.chown(path, account.uid, account.gid)
