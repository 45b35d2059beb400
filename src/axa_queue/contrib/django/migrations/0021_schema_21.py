"""Schema version 21: blocked jobs newest first (the index `axa_queue_blocked_created`),
so listing them reads a page of an index."""

from __future__ import annotations

from django.db import migrations

from axa_queue.contrib.django.tables import operation


class Migration(migrations.Migration):
    dependencies = (("axa_queue", "0020_schema_20"),)

    operations = (operation(21),)
