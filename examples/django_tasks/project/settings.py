"""Settings: the database from `DATABASE_URL`, Django's tasks on axa-queue."""

from __future__ import annotations

import os

from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(os.environ.get("DATABASE_URL", "postgresql:///shop"))

SECRET_KEY = os.environ.get("SECRET_KEY", "example-only")
DEBUG = True
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "project.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "axa_queue.contrib.django",  # the queue's tables (migrate), its admin, manage.py axa_queue
    "shop",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
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
        "NAME": _db.get("dbname", ""),
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
        "OPTIONS": {"options": _db["options"]} if "options" in _db else {},
    }
}

# Django's tasks (django.tasks on Django 6; the django-tasks backport on 5.2) on axa-queue.
TASKS = {"default": {"BACKEND": "axa_queue.contrib.django.AxaQueueBackend"}}
AXA_QUEUE = {"OPTIONS": {"workers": 4, "max_attempts": 3}}
