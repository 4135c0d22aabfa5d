"""API tokens in the console (docs/design/api.md#tokens): listed with their holder, name, expiry and
last use, issued and revoked — never a key. A key exists only in the answer to the form that issues
it (a page of its own, kept by no cache, message store or session), as in the API.

Issuing a token for someone is acting as them: a superuser may issue one for any user, other staff
(with runs.add_apitoken) for themselves only. Revoking needs runs.delete_apitoken, and ends the
token's streams as its holder's DELETE does.
"""

from typing import Any, cast

from django import forms
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from runs.admin.hardening import HardenedAdmin
from runs.exceptions import RunledgerError
from runs.models import ApiToken
from runs.services import token_create

SHOWN = ["user", "name", "created_at", "expires_at", "last_used_at", "issued_by"]


class IssueForm(forms.ModelForm):
    """The add form: holder, name, expiry. Valid only once the token is issued, by the one service
    that issues tokens (its refusals shown on the form's fields), so that the admin's save stores
    nothing more and the key is in hand for the answer. Issued last: what validation follows (the
    model's own, on these three fields) is what the form's fields already checked, and the new
    token itself is no duplicate of its name."""

    class Meta:
        model = ApiToken
        fields = ["user", "name", "expires_at"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        try:
            token, key = token_create(user=data["user"], name=data["name"], expires_at=data.get("expires_at"))
        except RunledgerError as exc:
            for field, problems in (exc.detail if isinstance(exc.detail, dict) else {}).items():
                if field in self.fields and isinstance(problems, list):
                    self.add_error(field, problems)
                    return data
            self.add_error(None, exc.message)
            return data
        token.key_once = key  # type: ignore[attr-defined]  # for `response_add`, never stored
        self.instance = token
        return data


@admin.register(ApiToken)
class ApiTokenAdmin(HardenedAdmin):
    list_display = ["name", "user", "created_at", "expires_at", "last_used_at", "issued_by"]
    search_fields = ["name", "user__username"]
    list_select_related = ["user", "issued_by"]
    raw_id_fields = ["user"]
    form = IssueForm

    def get_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return tuple(IssueForm.Meta.fields if obj is None else SHOWN)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return () if obj is None else tuple(SHOWN)

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        # Nothing from the query string: a text given for the expiry reaches Django's date widget
        # as it came, which fails to render it (a 500).
        return {}

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a token is issued or revoked, never edited

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "user" and not getattr(request.user, "is_superuser", False):
            kwargs["queryset"] = get_user_model().objects.filter(pk=cast(int, request.user.pk))
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        pass  # issued by the form's validation (IssueForm), where a refusal can still be shown

    def response_add(self, request: HttpRequest, obj: ApiToken, post_url_continue: str | None = None) -> HttpResponse:
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"API token {obj.name} of {obj.user}",
            "token": obj,
            "key": getattr(obj, "key_once", ""),
        }
        response = TemplateResponse(request, "admin/runs/apitoken/issued.html", context)
        response["Cache-Control"] = "no-store"
        return response
