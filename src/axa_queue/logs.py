"""Structured logs: one line per event, as JSON or as `key=value` text.

axa-queue logs with `extra` fields that name what an event is about (`job_id`, `job`,
`attempt`, `error`, `worker`, ...), never a job's arguments. These formatters print
those fields, so a log line can be searched by job id::

    {"time": "2026-05-01T09:00:00.120Z", "level": "warning", "logger": "axa_queue.worker",
     "pid": 4120, "message": "job failed, will retry: Report 3f2c... (attempt 1): raised
     RuntimeError; next try in 30 s", "job_id": "3f2c...", "job": "Report", "attempt": 1,
     "error": "RuntimeError: told to fail", "retry_in": 30.0}

    2026-05-01T09:00:00.120Z WARNING axa_queue.worker [4120] job failed, will retry:
     Report 3f2c... (attempt 1): raised RuntimeError; next try in 30 s job_id=3f2c...
     job=Report attempt=1 error="RuntimeError: told to fail" retry_in=30.0

(each is one line; they are wrapped here). The message stands alone, for where no
formatter prints the fields (a script without logging set up, whose warnings Python
prints bare): it names the job by name, id and attempt, and an error by its class
only; the error's text, which may hold whatever a handler put in it, is in `error`. `axa-queue worker --log-format` picks
one; a service can use them with `logging` as it likes, or call `configure`.

Every record made while a handler runs (by any logger: the service's own, a library's;
in the handler's task or its thread) carries the job's `job_id`, `job_name` and
`job_attempt` as attributes (`add_job_fields`, a log record factory the worker installs
once), so these formatters print them, and so can any other (`%(job_id)s`).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from datetime import datetime, timezone
from typing import Any, Literal, TextIO

from .context import running_or_none

__all__ = [
    "FORMATS",
    "JOB_FIELDS",
    "JsonFormatter",
    "LogFormat",
    "TextFormatter",
    "add_job_fields",
    "configure",
    "fields_of",
]

LogFormat = Literal["json", "text"]
"""The two line formats."""

FORMATS: tuple[LogFormat, ...] = ("json", "text")
"""Every value `configure` takes for `format`."""

_STANDARD = frozenset(
    {
        *logging.LogRecord("", 0, "", 0, "", (), None).__dict__,
        "message",
        "asctime",
        "taskName",
    }
)
"""A LogRecord's own attributes: everything else on a record came from `extra`."""

_NEVER = frozenset({"args", "arguments", "job_args", "args_text"})
"""Fields never printed, whoever sets them: a job's arguments may hold secrets."""


JOB_FIELDS = ("job_id", "job_name", "job_attempt")
"""The attributes every log record made during a run carries: the job's id (text), name
and attempt. Inside a handler, do not pass them in `extra` (logging refuses to overwrite
a record's attribute): they are there already. axa-queue's own loggers are left out:
their lines name the job they are about in their own fields (`job_id`, `job`,
`attempt`), which may be another job than the run's (`recover_stale` called by a
handler), and must never collide."""


def _ours(logger: str) -> bool:
    return logger == "axa_queue" or logger.startswith("axa_queue.")


_installed = False
_installing = threading.Lock()


def add_job_fields() -> None:
    """Make every log record made during a run (but axa-queue's own) carry `JOB_FIELDS`
    (idempotent). It wraps
    the process's log record factory (`logging.setLogRecordFactory`), so it applies to
    every logger and every handler, whatever the logging configuration; outside a run it
    costs one context variable read per record. A factory set later that wraps the
    current one (as OpenTelemetry's does) keeps it."""
    global _installed
    if _installed:
        return
    with _installing:
        if _installed:
            return
        previous = logging.getLogRecordFactory()

        def job_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            job = running_or_none()
            if job is not None and not _ours(record.name):
                record.job_id = str(job.id)
                record.job_name = job.name
                record.job_attempt = job.attempt
            return record

        logging.setLogRecordFactory(job_record)
        _installed = True


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The `extra` fields of `record`, in the order they were given, without arguments."""
    return {
        key: value
        for key, value in record.__dict__.items()
        if key not in _STANDARD and key not in _NEVER and not key.startswith("_")
    }


def _time(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _plain(value: Any) -> Any:
    """`value` as something JSON holds: numbers, booleans and None stay, the rest is text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC), level, logger, pid, message, then the
    event's fields, and `exception` with the traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": _time(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        for key, value in fields_of(record).items():
            line.setdefault(key, _plain(value))
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def _text_value(value: Any) -> str:
    text = str(value)
    if text and not any(ch.isspace() or ch in '"=\\' for ch in text):
        return text
    return json.dumps(text, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """One line per event for people: time, level, logger, [pid], message, then
    `key=value` fields (quoted when they hold spaces, line breaks escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if "\n" in message:
            message = json.dumps(message, ensure_ascii=False)
        parts = [
            _time(record),
            f"{record.levelname:<7}",
            f"{record.name} [{record.process}]",
            message,
        ]
        parts.extend(f"{key}={_text_value(value)}" for key, value in fields_of(record).items())
        if record.exc_info:
            parts.append(f"exception={_text_value(self.formatException(record.exc_info))}")
        return " ".join(parts)


def configure(
    format: LogFormat = "text", level: int | str = logging.INFO, stream: TextIO | None = None
) -> logging.Handler:
    """Send every log record (the root logger's) to `stream` (stderr by default), one
    line per event in `format`, at `level` and above; replaces the root's handlers.
    Returns the handler."""
    if format not in FORMATS:
        raise ValueError(f"expected format to be one of {', '.join(FORMATS)}, got: {format!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler
