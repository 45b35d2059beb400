"""Schema version 15: fairness by key: a job's `key` (in `axa_queue` and the history),
the indexes a keyed claim walks and counts by, and `axa_queue_key_room`, the function a
per-key limit is checked by. (Version 14 is another change's: the lead puts it first
in the chain when both are merged.)"""

from __future__ import annotations

from django.db import migrations

from axa_queue.contrib.django.tables import operation


class Migration(migrations.Migration):
    dependencies = (("axa_queue", "0014_schema_14"),)

    operations = (operation(15),)
