"""Schema version 16: the process of each job's last run on its own row (`run_worker`,
`run_attempt`, `run_host`, `run_pid`), stamped by the claim."""

from __future__ import annotations

from django.db import migrations

from axa_queue.contrib.django.tables import operation


class Migration(migrations.Migration):
    dependencies = (("axa_queue", "0015_schema_15"),)

    operations = (operation(16),)
