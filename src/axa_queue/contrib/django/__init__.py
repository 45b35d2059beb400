"""axa-queue in Django (the `[django]` extra): an installable app and a backend for
Django's tasks framework.

::

    INSTALLED_APPS += ["axa_queue.contrib.django"]
    TASKS = {"default": {"BACKEND": "axa_queue.contrib.django.AxaQueueBackend"}}
    AXA_QUEUE = {"DATABASE": "default"}          # optional (`conf`)

- `migrate` makes and upgrades the tables through the schema's own migrations
  (`tables`, `migrations/`), so `axa-queue check` agrees;
- `python manage.py axa_queue <command>` runs the `axa-queue` commands with Django set
  up and the database of the settings; `worker` without MODULE:ATTR runs the tasks
  (`worker`), and its `--processes` children start through `manage.py` too;
- handlers run with Django's connection handling (`use_django`), in `manage.py
  axa_queue worker` whichever queue it runs;
- `AxaQueueBackend` runs `@task`s (`backend`);
- the admin lists jobs and acts, and cancels and retries jobs (`admin`, `models`).

`AxaQueueBackend` and `use_django` are imported from here on first use, so Django
can import the app before its settings are ready.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AxaQueueBackend", "use_django"]


def __getattr__(name: str) -> Any:
    if name == "AxaQueueBackend":
        from .backend import AxaQueueBackend

        return AxaQueueBackend
    if name == "use_django":
        from .worker import use_django

        return use_django
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
