"""Settings of the tests' Django project. The database is `AXA_DJANGO_TEST_DSN` (a
libpq DSN whose `options` set the test's schema), read when the settings load; the
tests' fixtures point the connection at each test's schema instead."""

from __future__ import annotations

import os

from psycopg.conninfo import conninfo_to_dict

_given = conninfo_to_dict(os.environ.get("AXA_DJANGO_TEST_DSN") or "dbname=unused")

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
ROOT_URLCONF = "django_site.urls"
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "axa_queue.contrib.django",
    "django_site.shop",
]
try:  # the backport on Django 5.2 is an app of its own
    import django_tasks  # noqa: F401

    INSTALLED_APPS.append("django_tasks")
except ImportError:
    pass
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _given.get("dbname"),
        "USER": _given.get("user", ""),
        "PASSWORD": _given.get("password", ""),
        "HOST": _given.get("host", ""),
        "PORT": _given.get("port", ""),
        "OPTIONS": {"options": _given["options"]} if "options" in _given else {},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# The admin tests make a user each; PBKDF2's million rounds take most of a second of
# CPU per user, a fast hasher none (Django's own advice for test settings).
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
TASKS = {
    "default": {
        "BACKEND": "axa_queue.contrib.django.AxaQueueBackend",
        "ENQUEUE_ON_COMMIT": True,
    }
}
AXA_QUEUE = {
    "OPTIONS": {
        "poll_interval": 0.05,
        "heartbeat_interval": 0.1,
        "stale_after": 1.5,
        "retry_backoff": 0.05,
        "max_attempts": 1,
    }
}
