"""Schema version 20: each run's trace context kept for its dependents' spans to link to
(`axa_queue.run_trace`, `axa_queue_deps.parent_trace`)."""

from __future__ import annotations

from django.db import migrations

from axa_queue.contrib.django.tables import operation


class Migration(migrations.Migration):
    dependencies = (("axa_queue", "0019_schema_19"),)

    operations = (operation(20),)
