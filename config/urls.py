from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularSwaggerView

from runs.admin.hardening import view_on_site
from runs.signin import AdminLoginForm, throttled_login

# This site's own opinions; the app itself is included as any host includes it (last line).
# The console signs in through the throttled form too (docs/design/fair-use.md#sign-in-throttle).
# The first two URLs below, ahead of the admin's own, add the 429 status to its login page's
# refusal, and answer a malformed id in "view on site" with 404 (runs.admin.hardening).
admin.site.login_form = AdminLoginForm

urlpatterns = [
    path("admin/login/", throttled_login(admin.site.login)),
    path("admin/r/<path:content_type_id>/<path:object_id>/", admin.site.admin_view(view_on_site)),
    path("admin/", admin.site.urls),
    # The app's sign-in pages, as a host includes them: every page but the login page needs an
    # authenticated user (docs/design/api.md#public).
    path("accounts/", include("runs.signin_urls")),
    # A page to read the app's API schema (Swagger UI, its scripts served here: no CDN), public
    # like the schema; ahead of the app's URLs, whose api/ answers any other path with a 404.
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="runs:api-schema"), name="api-docs"),
    path("", include("runs.urls")),
]
