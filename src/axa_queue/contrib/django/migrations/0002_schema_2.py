"""Schema version 2: what axa-queue adds to the crate's tables."""

from __future__ import annotations

from django.db import migrations

from axa_queue.contrib.django.tables import operation


class Migration(migrations.Migration):
    dependencies = (("axa_queue", "0001_schema_1"),)

    operations = (operation(2),)
