"""Signing in over real HTTP from a chosen loopback address, as a browser does: the login page's
form, with its CSRF cookie and token. The web process sees the address as the client's."""

import re

import httpx

CSRF_FIELD = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


def sign_in_over_http(
    base_url: str, path: str, username: str, password: str, *, source: str, headers: dict[str, str] | None = None
) -> httpx.Response:
    """POST the login form at `path` from `source` (127.x.y.z), `headers` with each request; the
    answer, not followed."""
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(base_url=base_url, transport=transport, headers=headers, timeout=30) as client:
        page = client.get(path)
        found = CSRF_FIELD.search(page.text)
        assert page.status_code == 200 and found is not None, (page.status_code, page.text[:500])
        form = {"csrfmiddlewaretoken": found[1], "username": username, "password": password}
        return client.post(path, data=form)


def signed_in_over_http(answer: httpx.Response) -> bool:
    """The answer is a sign-in's redirect that set a session cookie."""
    return answer.status_code == 302 and "sessionid" in answer.cookies
