"""Schema version 7: the columns of runs claimed ahead (prefetch)."""

from __future__ import annotations

from django.db import migrations

from axa_queue.contrib.django.tables import operation


class Migration(migrations.Migration):
    dependencies = (("axa_queue", "0006_schema_6"),)

    operations = (operation(7),)
