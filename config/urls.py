from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from runs.signin import AdminLoginForm, LoginForm, throttled_login

# The console signs in through the throttled form too (DESIGN §6); its login URL below, ahead of
# the admin's own, adds the 429 status to a refusal.
admin.site.login_form = AdminLoginForm

urlpatterns = [
    path("admin/login/", throttled_login(admin.site.login)),
    path("admin/", admin.site.urls),
    # Only log in and out: password resets by e-mail are not part of this deployment, and every
    # page but the login page needs an authenticated user (DESIGN §6).
    path("accounts/login/", throttled_login(auth_views.LoginView.as_view(authentication_form=LoginForm)), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("runs.urls")),
]
