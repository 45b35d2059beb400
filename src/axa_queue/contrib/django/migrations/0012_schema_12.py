"""Schema version 12: the indexes that keep the newest jobs (`jobs`) a page's read on
millions of rows."""

from __future__ import annotations

from django.db import migrations

from axa_queue.contrib.django.tables import operation


class Migration(migrations.Migration):
    dependencies = (("axa_queue", "0011_schema_11"),)

    operations = (operation(12),)
