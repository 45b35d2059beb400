"""The `axa-queue` command: a thin shell over the public API (the `[cli]` extra).

::

    axa-queue setup | sql | check                  the tables
    axa-queue worker myapp.jobs:queue               run the jobs
    axa-queue enqueue NAME --args JSON              queue one
    axa-queue jobs | show ID | counts | schedules | workers | acts ID   look
    axa-queue workflow ID                           a workflow's members, as a tree
    axa-queue cancel ID --by B --reason R | retry ID ...        a person's acts
    axa-queue pause NAME --by B --reason R | resume NAME ... | paused   names
    axa-queue recover | purge | reindex             housekeeping, now
    axa-queue demo [--web]                          see it work, on an embedded server
    axa-queue web                                   the dashboard

The database comes from `--dsn`, else `AXA_QUEUE_DSN`, else `DATABASE_URL`. Tables are
for people, `--json` is for scripts, and no command ever prints a job's arguments. Bad
input ends in a one-line `Error: ...` and a non-zero status, never a traceback: 2 for
a mistake in the command line, 1 for anything else (an unknown job, an act that does
not apply, an unreachable database, a schema that is not set up).

Every command and option is described in `docs/cli.md`; a test keeps the two in step.

This package holds the top command and its error line (here), what every command
shares (`conventions`: the options, errors, and `answer`, which opens a queue and
prints what it found as JSON or as tables; `text`: what is printed), and one module
per group of commands: `tables` (setup, sql, check), `run` (worker), `jobs` (enqueue,
jobs, show, counts, schedules, workers), `workflows` (workflow), `acts` (acts, cancel, retry, pause, resume, paused), `housekeeping`
(recover, purge, move-history, reindex), `demo`, and `web` (the dashboard, served by uvicorn). What `worker`
runs is in `process` (one process) and `supervisor` (several
under a supervisor) and what `demo` runs is in `axa_queue.demo`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

try:
    import click
    import rich  # noqa: F401
except ImportError as missing:  # pragma: no cover - only without the extra
    raise SystemExit(
        f"the axa-queue command needs the cli extra ({missing.name} is not installed): "
        "pip install 'axa-queue[cli]'"
    ) from None

from .. import __version__
from . import acts, demo, housekeeping, jobs, run, tables, web, workflows
from .run import load_queue
from .text import one_line, shown

__all__ = ["load_queue", "main", "shown"]


class _Main(click.Group):
    """The top command; it prints every error as one line."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            result = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as error:
            if type(error).__name__ == "NoArgsIsHelpError" and error.ctx is not None:
                click.echo(error.ctx.get_help())  # bare `axa-queue`: show what there is
                sys.exit(0)
            hint = f" (see '{error.ctx.command_path} --help')" if error.ctx is not None else ""
            click.echo(f"Error: {shown(one_line(error.format_message()))}{hint}", err=True)
            sys.exit(error.exit_code)
        except click.ClickException as error:
            click.echo(f"Error: {shown(one_line(error.format_message()))}", err=True)
            sys.exit(error.exit_code)
        except click.Abort:
            click.echo("Aborted.", err=True)
            sys.exit(1)
        sys.exit(result if isinstance(result, int) else 0)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    __version__,
    "--version",
    prog_name="axa-queue",
    message="%(prog)s %(version)s",
    help="Print the version and exit.",
)
def main() -> None:
    """axa-queue: a job queue that lives entirely in PostgreSQL.

    New here? Run `axa-queue demo`. The database comes from --dsn, else $AXA_QUEUE_DSN,
    else $DATABASE_URL. Job arguments are never printed.
    """


for _command in (
    tables.setup,
    tables.sql_command,
    tables.check,
    run.worker,
    jobs.enqueue,
    jobs.jobs,
    jobs.show,
    jobs.counts,
    jobs.schedules,
    jobs.workers,
    workflows.workflow,
    acts.acts,
    acts.cancel_command,
    acts.retry_command,
    acts.pause_command,
    acts.resume_command,
    acts.paused,
    housekeeping.recover,
    housekeeping.purge,
    housekeeping.move_history,
    housekeeping.reindex,
    demo.demo_command,
    web.web,
):
    main.add_command(_command)
