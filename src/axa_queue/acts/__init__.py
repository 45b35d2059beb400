"""A person's acts, kept as records in `axa_job_acts`: on one job (`records`: cancel,
retry, release), on a job name (`names`: pause, resume), and on every job a filter
matches (`bulk`: cancel_all, retry_all, release_all)."""

from __future__ import annotations

from .bulk import BulkResult, JobFilter, cancel_all, release_all, retry_all
from .names import (
    Pause,
    name_acts_call,
    name_acts_on,
    pause,
    pause_call,
    paused_call,
    paused_on,
    resume,
    resume_call,
)
from .records import (
    MAX_REASON_CHARS,
    NIL_JOB,
    Act,
    ActKind,
    ActResult,
    act_of,
    acts_call,
    acts_on,
    cancel,
    check_code,
    retry,
)

__all__ = [
    "MAX_REASON_CHARS",
    "NIL_JOB",
    "Act",
    "ActKind",
    "ActResult",
    "BulkResult",
    "JobFilter",
    "Pause",
    "act_of",
    "acts_call",
    "acts_on",
    "cancel",
    "cancel_all",
    "check_code",
    "name_acts_call",
    "name_acts_on",
    "pause",
    "pause_call",
    "paused_call",
    "paused_on",
    "release_all",
    "resume",
    "resume_call",
    "retry",
    "retry_all",
]
