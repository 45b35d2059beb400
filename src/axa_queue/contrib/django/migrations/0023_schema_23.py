"""Schema version 23: the free slots of a rate limit found without numbering the whole
ring (migration 23's function, which the claim statements call)."""

from __future__ import annotations

from django.db import migrations

from axa_queue.contrib.django.tables import operation


class Migration(migrations.Migration):
    dependencies = (("axa_queue", "0022_schema_22"),)

    operations = (operation(23),)
