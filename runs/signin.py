"""Signing in: the login page (/accounts/login/, runs.signin_urls) and the console's form
(/admin/login/), with failed sign-ins throttled per username and per client address
(docs/design/fair-use.md#sign-in-throttle; the counting is `runs.http.throttles`).

The form, not Django's `user_login_failed` signal: the signal is sent after the password has been
checked, which is too late to refuse a guess without checking it, and it cannot change the answer.
The form runs around the check: it refuses a blocked sign-in before the password is looked at, and
its page says why. `throttled_login` gives that page the 429 status and its Retry-After.
"""

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponseBase

from runs.exceptions import TooManyRequests
from runs.http import throttles


class LoginForm(AuthenticationForm):
    # Why the sign-in was refused unchecked, for the page and its status.
    refusal: TooManyRequests | None = None

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username")
        password = self.cleaned_data.get("password")
        if not username or not password:
            return super().clean()  # a missing field: no password is checked, nothing is counted
        address = throttles.client_address(self.request) if self.request is not None else ""
        try:
            attempt = throttles.auth_login_begin(username=username, address=address)
        except TooManyRequests as exc:
            self.refusal = exc
            raise ValidationError(exc.message, code=exc.code) from exc
        try:
            cleaned = super().clean()
        except ValidationError:
            # A right password refused for another reason (the console's "not staff") is no guess.
            throttles.auth_login_end(attempt, failed=self.user_cache is None)
            raise
        throttles.auth_login_end(attempt, failed=False)
        return cleaned


class AdminLoginForm(LoginForm, AdminAuthenticationForm):
    """The console's: staff only (AdminAuthenticationForm), throttled like the login page."""


def throttled_login(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """A login view whose form was refused by the throttle answers 429 with Retry-After."""

    @wraps(view)
    def login(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        response = view(request, *args, **kwargs)
        form = (getattr(response, "context_data", None) or {}).get("form")
        refusal = getattr(form, "refusal", None)
        if isinstance(refusal, TooManyRequests):
            response.status_code = 429
            response["Retry-After"] = str(refusal.retry_after)
        return response

    return login


# Django's login view with the throttled form, on the app's own template: `runs/login.html`, never
# the `registration/login.html` a project may have for its own login page.
login_page = throttled_login(
    auth_views.LoginView.as_view(authentication_form=LoginForm, template_name="runs/login.html")
)
