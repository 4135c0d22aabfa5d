"""The staff console (Django's admin): the run admin (`run`), its list filters (`filters`), how it
displays runs and events (`display`), its commands (`commands`), and what keeps hostile URLs from
any admin page answering 500 (`hardening`), applied to every model admin on the site."""

from django.contrib import admin

from runs.admin.hardening import harden_every_admin
from runs.admin.run import RunAdmin

harden_every_admin(admin.site)

__all__ = ["RunAdmin"]
