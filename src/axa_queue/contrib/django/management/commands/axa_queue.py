"""`python manage.py axa_queue <command> ...`: the `axa-queue` commands (`worker`, `jobs`,
`show`, `counts`, `acts`, `cancel`, `retry`, `setup`, `check`, ...) with Django set up
and the database of the settings (`conf.environment`).

`worker` with no MODULE:ATTR runs the tasks of the tasks backend (`worker.TARGET`), and
with `--processes` starts each worker process the way this one was started (through
`manage.py`, or `python -m django` with the same settings module), so each sets Django
up before the queue's module is imported. Whichever queue it runs, the tasks' or the
MODULE:ATTR given, it runs it with Django's connection handling (`use_django`).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from ... import conf
from ...worker import TARGET, use_django

if TYPE_CHECKING:
    import click

__all__ = ["Command", "commands", "program"]


def program() -> tuple[str, ...]:
    """The command line that runs `manage.py axa_queue` again in a new process: this
    Python with the same `manage.py`, else `python -m django` with this settings module
    (and this process's `sys.path`, so the module is found)."""
    script = sys.argv[0] if sys.argv else ""
    if os.path.basename(script) == "manage.py" and os.path.isfile(script):
        return (sys.executable, os.path.abspath(script), "axa_queue")
    module = getattr(settings, "SETTINGS_MODULE", None)
    if not module:
        raise CommandError(
            "worker --processes needs a settings module (DJANGO_SETTINGS_MODULE) for its "
            "worker processes to set Django up: run it through manage.py"
        )
    os.environ["DJANGO_SETTINGS_MODULE"] = module
    paths = [p for p in sys.path if p] + [os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return (sys.executable, "-m", "django", "axa_queue")


def commands() -> click.Group:
    """The `axa-queue` commands as `manage.py axa_queue` runs them: the same, but for
    `worker`, which first sets Django's connection handling (`use_django`) on the queue
    it is to run, whichever it is: the tasks' (`TARGET`, which has it already) or the
    application's own `MODULE:ATTR`. It loads that queue as `worker` then does (the
    same object: the module is imported once), within its command line's parsing and
    error reporting."""
    from axa_queue.cli import load_queue, main

    given = main.commands["worker"]
    run = cast("Callable[..., Any]", given.callback)

    def worker(**params: Any) -> Any:
        use_django(load_queue(params.get("target") or TARGET))
        return run(**params)

    with_django = copy.copy(given)
    with_django.callback = worker
    group = copy.copy(main)
    group.commands = {**main.commands, "worker": with_django}
    return group


class Command(BaseCommand):
    help = (
        "Run an axa-queue command (worker, jobs, show, counts, acts, cancel, retry, setup, "
        "check, ...) with Django set up and the database from the settings. "
        "`worker` without MODULE:ATTR runs the tasks of the tasks backend. "
        "See `manage.py axa_queue --help`."
    )
    requires_system_checks: tuple[str, ...] = ()

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> Any:
        parser = super().create_parser(prog_name, subcommand, add_help=False, **kwargs)
        self._prog = f"{os.path.basename(prog_name)} {subcommand}"
        return parser

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("arguments", nargs=argparse.REMAINDER)

    def run_from_argv(self, argv: list[str]) -> None:
        """From the command line, every argument goes to the `axa-queue` command (its
        own `--help` included), but Django's `--settings` and `--pythonpath`, which
        `manage.py` has already applied."""
        self._prog = f"{os.path.basename(argv[0])} {argv[1]}"
        arguments: list[str] = []
        rest = iter(argv[2:])
        for one in rest:
            if one in ("--settings", "--pythonpath"):
                next(rest, None)
            elif not one.startswith(("--settings=", "--pythonpath=")):
                arguments.append(one)
        try:
            self.handle(arguments=arguments)
        finally:
            from django.db import connections

            connections.close_all()

    def handle(self, *args: Any, **options: Any) -> None:
        from axa_queue.cli.conventions import Invocation

        arguments = list(options["arguments"])
        wants_children = (
            bool(arguments)
            and arguments[0] == "worker"
            and any(a == "--processes" or a.startswith("--processes=") for a in arguments)
        )
        invocation = Invocation(
            program=program() if wants_children else (),
            default_target=TARGET,
        )
        with conf.environment():
            try:
                commands().main(
                    args=arguments,
                    prog_name=getattr(self, "_prog", "manage.py axa_queue"),
                    obj=invocation,
                )
            except SystemExit as done:
                if done.code:
                    raise
