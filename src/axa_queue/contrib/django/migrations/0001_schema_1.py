"""Schema version 1 (the crate's tables), and the admin's unmanaged models over them."""

from __future__ import annotations

from django.db import migrations, models

from axa_queue.contrib.django.tables import operation


class Migration(migrations.Migration):
    initial = True

    dependencies: tuple[tuple[str, str], ...] = ()

    operations = (
        operation(1),
        migrations.CreateModel(
            name="Job",
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
            ],
            options={
                "verbose_name": "job",
                "db_table": "axa_queue",
                "ordering": ("-created_at",),
                "permissions": (("act_on_job", "Can cancel and retry jobs"),),
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="JobAct",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("job_id", models.UUIDField()),
                ("job_name", models.TextField()),
                ("act", models.TextField()),
                ("attempts", models.IntegerField()),
                ("by", models.TextField()),
                ("reason", models.TextField()),
                ("at", models.DateTimeField()),
                ("db_role", models.TextField(null=True)),
            ],
            options={
                "verbose_name": "act on a job",
                "verbose_name_plural": "acts on jobs",
                "db_table": "axa_job_acts",
                "ordering": ("-id",),
                "managed": False,
            },
        ),
    )
