"""Schema version 9: the history table finished jobs are moved to."""

from __future__ import annotations

from django.db import migrations

from axa_queue.contrib.django.tables import operation


class Migration(migrations.Migration):
    dependencies = (("axa_queue", "0008_schema_8"),)

    operations = (operation(9),)
