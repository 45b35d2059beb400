"""`AxaQueueBackend`: Django's tasks framework (`django.tasks` on Django 6, the
`django-tasks` backport on Django 5.2) on axa-queue.

::

    TASKS = {"default": {"BACKEND": "axa_queue.contrib.django.AxaQueueBackend"}}

A task enqueued is a job named by the task's module path (`shop.tasks.send_email`)
whose arguments are `{"args": [...], "kwargs": {...}}`; its priority is Django's (-100
to 100, higher first, as ours) and `run_after` its `run_at`. With `ENQUEUE_ON_COMMIT`
(the default) the job is queued when the transaction of the task's database commits,
and never when it rolls back; without it, at once, on the queue's own connection. The
result's id is the job's id, known before either.

`get_result()` reads the job back (`sql.TASK_RESULT`): its state as Django's status
(`queued`: READY; `running`: RUNNING; `completed`: SUCCESSFUL; `failed`, `cancelled`
and `needs_review`: FAILED), its error as a `TaskError` (the exception's class path,
and as its traceback the text the job kept: the type and message, never the
arguments), the return value the worker stored, its attempts and times.

Every task made by `@task` with this backend is remembered by module path in this
process (`known_tasks`), which is how `manage.py axa_queue worker` finds what to run.
"""

from __future__ import annotations

import builtins
import datetime as dt
import importlib
import re
from collections.abc import Callable
from inspect import iscoroutinefunction
from typing import Any
from uuid import UUID, uuid4

from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from ... import NewJob, SyncQueue, sql
from ...db.calls import Call, run_sync
from ...errors import OptionsError
from ...jobs.enqueue import enqueue_call
from ...jobs.model import check_name, job_id_of, moment, optional_moment
from . import conf

__all__ = [
    "AxaQueueBackend",
    "AxaQueueTask",
    "TaskFailure",
    "known_tasks",
    "raised_as",
    "task_error",
    "tasks_api",
]


def _import_tasks_api() -> Any:
    try:
        return importlib.import_module("django.tasks")  # Django 6
    except ImportError:
        return importlib.import_module("django_tasks")  # the backport, on Django 5.2


tasks_api: Any = _import_tasks_api()
"""Django's tasks framework: `django.tasks`, or the `django_tasks` backport."""
_base: Any = importlib.import_module(f"{tasks_api.__name__}.base")
_backends: Any = importlib.import_module(f"{tasks_api.__name__}.backends.base")
_exceptions: Any = importlib.import_module(f"{tasks_api.__name__}.exceptions")
_signals: Any = importlib.import_module(f"{tasks_api.__name__}.signals")
InvalidTask: type[Exception] = (
    getattr(_exceptions, "InvalidTask", None) or _exceptions.InvalidTaskError
)
TaskResultDoesNotExist: type[Exception] = _exceptions.TaskResultDoesNotExist
Status: Any = _base.TaskResultStatus

PRIORITIES = (_base.TASK_MIN_PRIORITY, _base.TASK_MAX_PRIORITY)
"""Django's range of priorities; a job's own priority (a smallint) is kept within it
when read back."""

STATUSES = {
    "queued": Status.READY,
    "running": Status.RUNNING,
    "completed": Status.SUCCESSFUL,
    "failed": Status.FAILED,
    "cancelled": Status.FAILED,
    "needs_review": Status.FAILED,
}
"""A job's state as Django's `TaskResultStatus`: a cancelled job did not run and never
will, and one that waits for review will not run unless a person releases it."""

known_tasks: dict[str, Any] = {}
"""Every task made with this backend in this process, by module path (its job name)."""


def _import_normalize_json() -> Callable[[Any], Any]:
    try:
        found: Callable[[Any], Any] = importlib.import_module("django.utils.json").normalize_json
    except (ImportError, AttributeError):  # before Django 6: the backport's own
        found = importlib.import_module("django_tasks.utils").normalize_json
    return found


_normalize_json = _import_normalize_json()
"""Django's `normalize_json`: a value as JSON has it (tuples as lists, bytes as text),
as Django's own backends store arguments and return values."""


class AxaQueueTask(_base.Task):
    """Django's `Task`, remembered by module path (`known_tasks`) as it is made."""

    __slots__ = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        known_tasks.setdefault(self.module_path, self)  # the @task itself, made first


class TaskFailure(Exception):
    """What a task's exception is raised again as in the worker, so the job's error (the
    exception's type and message, see `retries.describe`) names the class by its path:
    `shop.tasks.PaymentDeclined: card declined`. Its subclasses are made per path
    (`raised_as`); the original is its cause."""


_failures: dict[str, type[TaskFailure]] = {}


def raised_as(error: BaseException) -> TaskFailure:
    """`error` as a `TaskFailure` whose type is named by `error`'s class path."""
    kind = type(error)
    path = f"{kind.__module__}.{kind.__qualname__}"
    made = _failures.get(path)
    if made is None:
        made = type(kind.__name__, (TaskFailure,), {"__module__": kind.__module__})
        made.__qualname__ = path
        _failures[path] = made
    return made(str(error))


_PATH = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")


def task_error(error: str) -> Any:
    """The `TaskError` Django reports for a job's error text: the class path the text
    starts with (`raised_as`), a builtin's (`ValueError: ...` becomes
    `builtins.ValueError`), `builtins.TimeoutError` for a run that timed out, else
    `axa_queue.errors.AxaQueueError` (a run lost or abandoned); the text itself as the
    traceback (the job keeps no more)."""
    head = error.partition(": ")[0].strip()
    builtin = getattr(builtins, head, None) if _PATH.fullmatch(head) else None
    if _PATH.fullmatch(head) and "." in head:
        path = head
    elif isinstance(builtin, type) and issubclass(builtin, BaseException):
        path = f"builtins.{head}"
    elif error.startswith("timed out"):
        path = "builtins.TimeoutError"
    else:
        path = "axa_queue.errors.AxaQueueError"
    return _base.TaskError(exception_class_path=path, traceback=error)


class AxaTaskResult(_base.TaskResult):
    """Django's `TaskResult`, whose text leaves out the arguments."""

    __slots__ = ()

    def __repr__(self) -> str:
        return (
            f"<TaskResult {self.id} {self.task.module_path} {self.status} attempts={self.attempts}>"
        )


def _read_task_result(rows: list[Any], _count: int) -> Any:
    return rows[0] if rows else None


def task_result_call(job_id: UUID) -> Call[Any]:
    """The call that reads a job as a task's result (`sql.TASK_RESULT`), or `None`."""
    return Call(sql.TASK_RESULT, {"id": job_id}, _read_task_result)


class AxaQueueBackend(_backends.BaseTaskBackend):
    """Django's tasks on axa-queue: see the module's docstring. Settings (besides
    `BACKEND`, `QUEUES` and `OPTIONS`, which Django defines): `ENQUEUE_ON_COMMIT`
    (default True)."""

    task_class = AxaQueueTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.enqueue_on_commit = bool(params.get("ENQUEUE_ON_COMMIT", True))
        self._queue: SyncQueue | None = None
        self._dsn: str | None = None

    @property
    def queue(self) -> SyncQueue:
        """The queue's own sync pool, on the database the settings name now: made on
        first use, and again when that changes (a test pointing Django elsewhere)."""
        dsn = conf.dsn()
        if self._queue is None or self._dsn != dsn:
            self.close()
            self._queue = SyncQueue(dsn, conf.queue_options())
            self._dsn = dsn
        return self._queue

    def close(self) -> None:
        """Close the queue's pool (it opens again on next use)."""
        if self._queue is not None:
            self._queue.close()

    def validate_task(self, task: Any) -> None:
        """Django's checks, and a module path that can name a job."""
        super().validate_task(task)
        try:
            check_name(task.module_path, "task's job")
        except OptionsError as error:
            raise InvalidTask(str(error)) from None

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Queue `task` with `args` and `kwargs`: when the transaction commits (with
        `ENQUEUE_ON_COMMIT`), else now; returns its `TaskResult`, READY."""
        self.validate_task(task)
        arguments = {"args": _normalize_json(list(args)), "kwargs": _normalize_json(dict(kwargs))}
        run_after = task.run_after
        if run_after is not None and timezone.is_naive(run_after):
            run_after = timezone.make_aware(run_after)
        job = NewJob(task.module_path, arguments, priority=task.priority, run_at=run_after)
        job_id = uuid4()
        call = enqueue_call(job, job_id=job_id)
        result = AxaTaskResult(
            task=task,
            id=str(job_id),
            status=Status.READY,
            enqueued_at=None,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=arguments["args"],
            kwargs=arguments["kwargs"],
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )

        def send() -> None:
            with self.queue.pool.connection() as conn:
                run_sync(conn, call)
            object.__setattr__(result, "enqueued_at", timezone.now())
            _signals.task_enqueued.send(type(self), task_result=result)

        if self.enqueue_on_commit:
            transaction.on_commit(send, using=conf.database_alias())
        else:
            send()
        return result

    def get_result(self, result_id: str) -> Any:
        """The task's result as the job's row has it; `TaskResultDoesNotExist` when
        there is no such job or it is not a task's."""
        try:
            job_id = job_id_of(result_id)
        except OptionsError:
            raise TaskResultDoesNotExist(f"no task result {result_id!r}: not a job id") from None
        with self.queue.pool.connection() as conn:
            row = run_sync(conn, task_result_call(job_id))
        if row is None:
            raise TaskResultDoesNotExist(f"no task result {result_id}")
        task = _task_named(row.name)
        if task is None:
            raise TaskResultDoesNotExist(
                f"job {result_id} is not a task's: no task is named {row.name!r}"
            )
        return result_of(task, row, self.alias)


def _task_named(path: str) -> Any:
    """The task whose module path is `path`: made in this process, else imported."""
    if path in known_tasks:
        return known_tasks[path]
    try:
        found = import_string(path)
    except ImportError:
        return None
    return found if isinstance(found, _base.Task) else None


def result_of(task: Any, row: Any, backend: str) -> Any:
    """The `TaskResult` of `task` a row of `sql.TASK_RESULT` tells."""
    status = STATUSES.get(row.status, Status.FAILED)
    finished = status in (Status.SUCCESSFUL, Status.FAILED)
    started = optional_moment(row.started_at)
    arguments = row.args if isinstance(row.args, dict) else {}
    priority = min(max(row.priority, PRIORITIES[0]), PRIORITIES[1])
    errors = [task_error(row.error)] if row.error and status != Status.SUCCESSFUL else []
    if row.status == "cancelled" and not errors:
        errors = [task_error("cancelled: the job was cancelled before it ran")]
    result = AxaTaskResult(
        task=task.using(priority=priority) if priority != task.priority else task,
        id=str(row.id),
        status=status,
        enqueued_at=moment(row.created_at),
        started_at=started,
        finished_at=moment(row.updated_at) if finished else None,
        last_attempted_at=started,
        args=list(arguments.get("args", [])),
        kwargs=dict(arguments.get("kwargs", {})),
        backend=backend,
        errors=errors,
        worker_ids=[f"attempt-{n}" for n in range(1, row.attempts + 1)],
    )
    object.__setattr__(result, "_return_value", row.result)
    return result


def runner(task: Any) -> Callable[[Any], Any]:
    """The handler that runs `task` for its jobs: async for a coroutine function (on
    the worker's loop), else sync (in a job thread); the return value normalized as
    Django does; an exception raised again as `raised_as` it. Django's `task_started`
    and `task_finished` signals are sent around each run, as Django's backends do."""

    if iscoroutinefunction(task.func):

        async def run_async(arguments: dict[str, Any]) -> Any:
            run = _Run(task, arguments)
            try:
                value = await task.acall(*run.args, **run.kwargs)
            except Exception as error:
                raise run.failed(error) from error
            return run.completed(value)

        return run_async

    def run_sync(arguments: dict[str, Any]) -> Any:
        run = _Run(task, arguments)
        try:
            value = task.call(*run.args, **run.kwargs)
        except Exception as error:
            raise run.failed(error) from error
        return run.completed(value)

    return run_sync


class _Run:
    """One run of a task: its arguments (the `TaskContext` first, if the task takes
    it), its `TaskResult` as Django's signals see it, and how it ended."""

    def __init__(self, task: Any, arguments: Any) -> None:
        from ... import NotInAJobError, current_job

        if not isinstance(arguments, dict):
            raise TypeError("a task's job arguments must be {'args': [...], 'kwargs': {...}}")
        self.args = list(arguments.get("args") or [])
        self.kwargs = dict(arguments.get("kwargs") or {})
        try:
            job = current_job()
            job_id, attempt = str(job.id), job.attempt
        except NotInAJobError:  # not in a worker's run
            job_id, attempt = "", 1
        now = dt.datetime.now(dt.timezone.utc)
        self.result = AxaTaskResult(
            task=task,
            id=job_id,
            status=Status.RUNNING,
            enqueued_at=None,
            started_at=now,
            finished_at=None,
            last_attempted_at=now,
            args=self.args,
            kwargs=self.kwargs,
            backend=task.backend,
            errors=[],
            worker_ids=[f"attempt-{n}" for n in range(1, attempt + 1)],
        )
        self.sender = type(tasks_api.task_backends[task.backend])
        if task.takes_context:
            self.args = [_base.TaskContext(task_result=self.result), *self.args]
        _signals.task_started.send(sender=self.sender, task_result=self.result)

    def completed(self, value: Any) -> Any:
        """The task returned `value`: normalized, as it is stored."""
        value = _normalize_json(value)
        self._finish(Status.SUCCESSFUL)
        object.__setattr__(self.result, "_return_value", value)
        _signals.task_finished.send(sender=self.sender, task_result=self.result)
        return value

    def failed(self, error: BaseException) -> TaskFailure:
        """The task raised `error`: what the run raises instead (`raised_as`)."""
        failure = raised_as(error)
        self._finish(Status.FAILED)
        self.result.errors.append(task_error(f"{type(failure).__qualname__}: {failure}"))
        _signals.task_finished.send(sender=self.sender, task_result=self.result)
        return failure

    def _finish(self, status: Any) -> None:
        object.__setattr__(self.result, "status", status)
        object.__setattr__(self.result, "finished_at", dt.datetime.now(dt.timezone.utc))
