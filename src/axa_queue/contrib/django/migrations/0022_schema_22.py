"""Schema version 22: the release of dependents kept linear in a statement's endings,
whatever their number and order (migration 22's functions in the release triggers)."""

from __future__ import annotations

from django.db import migrations

from axa_queue.contrib.django.tables import operation


class Migration(migrations.Migration):
    dependencies = (("axa_queue", "0021_schema_21"),)

    operations = (operation(22),)
