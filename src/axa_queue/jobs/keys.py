"""A job's key (`NewJob.key`): who the job is for (a tenant, a customer), the unit of
fairness of a name claimed by key (`Queue.limit_per_key`). Checked as a person's `by`
is (`acts.check_code`'s rule): a visible code, never echoed in an error (a key may name
a customer)."""

from __future__ import annotations

from ..errors import OptionsError

__all__ = ["MAX_KEY_CHARS", "check_key", "key_ok"]

MAX_KEY_CHARS = 200
"""The longest key, in characters."""


def check_key(key: object, job: str) -> str:
    """`key` when it can be a job's key: a `str` of 1 to `MAX_KEY_CHARS` characters,
    every one printable (`str.isprintable`: no control, format, zero-width or bidi
    character, no line separator, no space but the ASCII space), no space first or
    last; else an `OptionsError` naming the job and the rule, never the key."""
    if (
        isinstance(key, str)
        and 0 < len(key) <= MAX_KEY_CHARS
        and key.isprintable()
        and key[0] != " "
        and key[-1] != " "
    ):
        return key
    raise OptionsError(
        f"the key of job {job!r} cannot be used: a key is 1 to {MAX_KEY_CHARS} visible "
        "characters (letters, digits, punctuation, symbols, and ASCII spaces between "
        "them), with no control, zero-width or bidi character and no space first or "
        "last; nothing was queued"
    )


def key_ok(key: object, job: str) -> bool:
    """True when a job named `job` has no key, else its key checked (`check_key`)."""
    return key is None or bool(check_key(key, job))
