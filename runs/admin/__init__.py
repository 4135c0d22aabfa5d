"""The staff console (Django's admin): the run admin (`run`), its list filters (`filters`), how it
displays runs and events (`display`) and its commands (`commands`)."""

from runs.admin.run import RunAdmin

__all__ = ["RunAdmin"]
