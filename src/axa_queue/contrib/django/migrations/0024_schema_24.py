"""Schema version 24: a workflow's endings noted and marked at less cost (migration
24's noting function, and the dependencies' pages filled to 40%)."""

from __future__ import annotations

from django.db import migrations

from axa_queue.contrib.django.tables import operation


class Migration(migrations.Migration):
    dependencies = (("axa_queue", "0023_schema_23"),)

    operations = (operation(24),)
