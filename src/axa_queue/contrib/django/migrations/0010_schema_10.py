"""Schema version 10: the history table finished jobs are moved to, and the admin's
unmanaged model over it."""

from __future__ import annotations

from django.db import migrations, models

from axa_queue.contrib.django.tables import operation


class Migration(migrations.Migration):
    dependencies = (("axa_queue", "0009_schema_9"),)

    operations = (
        operation(10),
        migrations.CreateModel(
            name="MovedJob",
            fields=[
                ("id", models.UUIDField(primary_key=True, serialize=False)),
                ("name", models.TextField()),
                (
                    "status",
                    models.TextField(
                        choices=[
                            ("queued", "queued"),
                            ("running", "running"),
                            ("completed", "completed"),
                            ("failed", "failed"),
                            ("cancelled", "cancelled"),
                            ("needs_review", "needs review"),
                        ]
                    ),
                ),
                ("error", models.TextField(null=True)),
                ("attempts", models.IntegerField()),
                ("max_attempts", models.IntegerField(null=True)),
                ("priority", models.SmallIntegerField()),
                ("timeout_ms", models.BigIntegerField(null=True)),
                ("run_at", models.DateTimeField()),
                ("started_at", models.DateTimeField(null=True)),
                ("created_at", models.DateTimeField()),
                ("updated_at", models.DateTimeField()),
                ("moved_at", models.DateTimeField()),
            ],
            options={
                "verbose_name": "finished job (history)",
                "verbose_name_plural": "finished jobs (history)",
                "db_table": "axa_queue_history",
                "ordering": ("-updated_at",),
                "managed": False,
            },
        ),
    )
