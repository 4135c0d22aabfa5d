# A run's priority and start time, the owner's turn in fair share, and the claim's
# indexes for them (docs/design/fair-use.md#priority). `run_queued_owner` gives way to
# `run_queued_turn` (the ranking) and `run_queued_pick` (each owner's run by priority).

from django.db import migrations, models

QUEUED = models.Q(("status", "queued"))

FIELDS = [
    ("priority", models.SmallIntegerField(default=0)),
    ("start_after", models.DateTimeField(blank=True, null=True)),
    ("turn_at", models.DateTimeField(blank=True, null=True)),
]

INDEXES = [
    models.Index(condition=QUEUED, fields=["owner", "turn_at"], name="run_queued_turn"),
    models.Index(condition=QUEUED, fields=["owner", "-priority", "created_at", "id"], name="run_queued_pick"),
    models.Index(
        condition=models.Q(("priority__gt", 100), ("status", "queued")),
        fields=["-priority", "created_at", "id"],
        name="run_queued_urgent",
    ),
    models.Index(
        condition=models.Q(("start_after__isnull", False), ("status", "queued")),
        fields=["start_after"],
        name="run_queued_start",
    ),
]

PERMISSIONS = [
    ("cancel_run", "Can cancel any visible run"),
    ("stop_run", "Can stop runs"),
    ("prioritize_run", "Can give runs a priority above 100, claimed before fair share"),
]


def turns_of_live_runs(apps, schema_editor):
    # Only a live run can be queued again; an ended run's turn is never read.
    Run = apps.get_model("runs", "Run")
    Run.objects.filter(turn_at__isnull=True, status__in=["queued", "running", "waiting"]).update(
        turn_at=models.F("created_at")
    )


class Migration(migrations.Migration):
    dependencies = [("runs", "0011_run_rerun_of")]

    operations = [
        migrations.AlterModelOptions(name="run", options={"ordering": ["-created_at"], "permissions": PERMISSIONS}),
        migrations.RemoveIndex(model_name="run", name="run_queued_owner"),
        *(migrations.AddField(model_name="run", name=name, field=field) for name, field in FIELDS),
        migrations.RunPython(turns_of_live_runs, migrations.RunPython.noop),
        *(migrations.AddIndex(model_name="run", index=index) for index in INDEXES),
        migrations.AddConstraint(
            model_name="run",
            constraint=models.CheckConstraint(
                condition=models.Q(("priority__gte", -100), ("priority__lte", 1000)), name="run_priority_bounded"
            ),
        ),
    ]
