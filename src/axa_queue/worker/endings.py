"""What the log says of how a run ended: completed (at debug level only), snoozed, slept,
failed and retried, failed, or cancelled by a person; and of a backoff function that
failed. Each message names the job, its id and attempt (`Run.named`) and says of a
failure its class (`Outcome.cause`); the error's text goes in the record's `error`
field only. Never the job's arguments.
"""

from __future__ import annotations

import logging

from ..handlers.retries import describe, kind
from .decisions import Outcome
from .run import Run

__all__ = ["backoff_failed", "cancelled", "ended"]

log = logging.getLogger("axa_queue.worker")


def ended(one: Run, outcome: Outcome, trace: BaseException | None) -> None:
    """Log how `one` ended (a completion only at debug level), with the traceback of
    what its handler raised if `trace` is given."""
    if outcome.kind == "completed":
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "job completed: %s %s (attempt %d) in %.3f s",
                *one.named(),
                one.seconds,
                extra={**one.fields(), "duration": round(one.seconds, 6)},
            )
    elif outcome.kind == "snoozed":
        log.info(
            "job snoozed: %s %s (attempt %d) for %g s",
            *one.named(),
            outcome.delay,
            extra={**one.fields(), "error": outcome.error, "retry_in": outcome.delay},
        )
    elif outcome.kind == "slept":
        log.info(
            "job sleeping: %s %s (attempt %d) for %g s",
            *one.named(),
            outcome.delay,
            extra={**one.fields(), "retry_in": outcome.delay},
        )
    elif outcome.kind == "retried":
        log.warning(
            "job failed, will retry: %s %s (attempt %d): %s; next try in %g s",
            *one.named(),
            outcome.cause,
            outcome.delay,
            extra={**one.fields(), "error": outcome.error, "retry_in": outcome.delay},
            exc_info=trace,
        )
    else:
        log.error(
            "job failed: %s %s (attempt %d): %s",
            *one.named(),
            outcome.cause,
            extra={**one.fields(), "error": outcome.error},
            exc_info=trace,
        )


def cancelled(one: Run) -> None:
    """`one`'s job was cancelled by a person under its attempt: nothing of the run is
    written."""
    log.info(
        "job stopped: %s %s (attempt %d) was cancelled by a person while it ran; "
        "nothing of the run is recorded"
        if one.started
        else "job not started: %s %s (attempt %d) was cancelled by a person",
        *one.named(),
        extra=one.fields(),
    )


def backoff_failed(one: Run, failure: Exception) -> None:
    """The backoff function of `one`'s handler raised: its job waits the queue's
    `retry_backoff` instead (`Policy.wait`), and this says so."""
    log.error(
        "the handler's backoff failed: %s %s (attempt %d): %s; the job waits the "
        "queue's retry_backoff instead",
        *one.named(),
        kind(failure),
        extra={**one.fields(), "error": describe(failure)},
    )
