"""What keeps hostile URLs from the console's pages answering 500, for every model admin on the site
(docs/design/fair-use.md#admin-input): a changelist takes only its declared filters' parameters (and
its admin's `extra_lookups`), no NUL, and a query that compiles — anything else is an invalid filter
(`?e=1`), as Django answers a malformed value; a list action's selected ids that are not ids of the
model select nothing, rather than failing in the database."""

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.contrib.contenttypes import views as contenttype_views
from django.core.exceptions import EmptyResultSet, ValidationError
from django.db import models
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse

from runs.cursors import largest_of, plain_int


def is_id_of(field: "models.Field[Any, Any]", value: str) -> bool:
    """Whether `value` (from a form or a URL) can be a value of the key `field` in the database."""
    if "\x00" in value:
        return False  # PostgreSQL text holds none
    if isinstance(field, models.IntegerField):
        return plain_int(value, most=largest_of(field.get_internal_type())) is not None
    try:
        field.to_python(value)
    except (ValidationError, ValueError):
        return False
    return True


class HardenedChangeList(ChangeList):
    def get_filters(self, request: HttpRequest) -> Any:
        # PostgreSQL text holds no NUL: compared with one, the query fails as the page is read.
        if any("\x00" in value for values in self.filter_params.values() for value in values):
            raise IncorrectLookupParameters("a query parameter holds a NUL character")
        filters = super().get_filters(request)
        # What the declared filters did not take: lookups the admin never offered.
        unknown = set(filters[2]) - set(getattr(self.model_admin, "extra_lookups", ()))
        if unknown:
            raise IncorrectLookupParameters(f"not a filter of this list: {', '.join(sorted(unknown))}")
        return filters

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        queryset = super().get_queryset(request, exclude_parameters)
        try:
            # Values the database adapter cannot take fail here, not as the page is rendered.
            queryset.query.sql_with_params()
        except EmptyResultSet:
            pass  # a filter that matches nothing (queryset.none()): valid
        except (ValueError, OverflowError) as exc:
            raise IncorrectLookupParameters(exc) from exc
        return queryset


class HardenedAdmin(admin.ModelAdmin):
    # Lookups the list takes besides its declared filters' parameters (links the console makes).
    extra_lookups: tuple[str, ...] = ()

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        changelist = super().get_changelist(request, **kwargs)
        if issubclass(changelist, HardenedChangeList):
            return changelist
        return type(f"Hardened{changelist.__name__}", (HardenedChangeList, changelist), {})

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        # An empty ?_to_field= passes the admin's check (it is falsy) and then names the field ""
        # (FieldDoesNotExist: a 500); it means no field, as when it is absent.
        return super().get_object(request, object_id, from_field or None)

    def response_action(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        selected = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        if not all(is_id_of(self.model._meta.pk, value) for value in selected):
            self.message_user(request, "The selection names no such items; nothing was done.", messages.WARNING)
            return None
        return super().response_action(request, queryset)


def harden_every_admin(site: admin.AdminSite) -> None:
    """Register every model admin of `site` that is not yet hardened again, hardened: Django's and
    other apps', registered before the console's (`runs` comes last in INSTALLED_APPS)."""
    for model, model_admin in list(site._registry.items()):
        if not isinstance(model_admin, HardenedAdmin):
            kind = type(model_admin)
            site.unregister(model)
            site.register(model, type(kind.__name__, (HardenedAdmin, kind), {"__module__": kind.__module__}))


def view_on_site(request: HttpRequest, content_type_id: str, object_id: str) -> HttpResponse:
    """Django's "view on site" redirect, where a malformed id of a model whose primary key
    validates (a run's UUID) is a 404 (Django lets the ValidationError through: a 500)."""
    try:
        return contenttype_views.shortcut(request, content_type_id, object_id)
    except ValidationError as exc:
        raise Http404("no such object") from exc
