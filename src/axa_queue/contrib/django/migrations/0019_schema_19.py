"""Schema version 19: the claim's narrow per-name index (`axa_queue_pick_hash`)."""

from __future__ import annotations

from django.db import migrations

from axa_queue.contrib.django.tables import operation


class Migration(migrations.Migration):
    dependencies = (("axa_queue", "0018_schema_18"),)

    operations = (operation(19),)
