# The dashboard's entry in the admin (a proxy of Run: no table).

from django.db import migrations

options = {"verbose_name": "dashboard", "verbose_name_plural": "dashboard", "proxy": True, "default_permissions": ()}


class Migration(migrations.Migration):
    dependencies = [("runs", "0008_stored_bytes")]
    operations = [migrations.CreateModel(name="Dashboard", fields=[], options=options, bases=("runs.run",))]
