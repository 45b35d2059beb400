"""Schema version 6: the function global limits are claimed by."""

from __future__ import annotations

from django.db import migrations

from axa_queue.contrib.django.tables import operation


class Migration(migrations.Migration):
    dependencies = (("axa_queue", "0005_schema_5"),)

    operations = (operation(6),)
