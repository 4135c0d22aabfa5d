"""The sign-in pages, for a project to include where Django looks for them by default:
`path("accounts/", include("runs.signin_urls"))` gives `/accounts/login/` (Django's default
`LOGIN_URL`) and `/accounts/logout/`, named `login` and `logout` as `django.contrib.auth.urls` names
them, with failed sign-ins throttled (runs.signin; docs/how-to/embed.md#sign-in)."""

from django.contrib.auth import views as auth_views
from django.urls import URLPattern, path

from runs.signin import login_page

# Only signing in and out: password resets by e-mail need a mail setup the app cannot assume.
urlpatterns: list[URLPattern] = [
    path("login/", login_page, name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
]
