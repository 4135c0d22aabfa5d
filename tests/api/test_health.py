import json
import urllib.request

import pytest

from tests.support.procs import Procs

pytestmark = [pytest.mark.sqlite, pytest.mark.processes]


@pytest.mark.django_db(transaction=True)
def test_probes_answer_json_from_a_real_uvicorn_process(procs: Procs) -> None:
    web = procs.uvicorn()
    for path, expected in (("/healthz/", {"status": "ok"}), ("/readyz/", {"status": "ok"})):
        with urllib.request.urlopen(web.url + path, timeout=5) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "application/json"
            body = json.load(response)
        assert body.items() >= expected.items()


@pytest.mark.django_db(transaction=True)
def test_probes_answer_head_as_load_balancers_send_it(procs: Procs) -> None:
    web = procs.uvicorn()
    for path in ("/healthz/", "/readyz/"):
        request = urllib.request.Request(web.url + path, method="HEAD")
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "application/json"
            assert response.read() == b""  # the GET's status and headers, no body
