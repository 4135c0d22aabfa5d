"""The front door in production (docs/how-to/deploy.md#front-door, deploy/): a real nginx started from
deploy/nginx.conf.template in front of uvicorn and a worker in the front door's layout — uvicorn on a
Unix socket in the folder deploy/tmpfiles.d/runledger.conf makes, nginx the only way in, the SSE edge
on a socket beside it."""

import asyncio
import grp
import json
import re
import shutil
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User

from runs.models import Run, RunEvent
from tests.factories import queued_run
from tests.support.browser import give_password
from tests.support.db import token_for
from tests.support.deploy import run_to_end, unit_uvicorn
from tests.support.edge import control_socket, edge_env, listening_tcp_ports, start_edge, wait_leading
from tests.support.nginx import (
    TEMPLATE,
    TEMPLATE_VARIABLES,
    Nginx,
    fill_template,
    front_door,
    shared_folder,
    start_nginx,
    template_variables,
)
from tests.support.procs import Proc, Procs, descendants, python_as, require_root, subprocess_env, wait_log_line
from tests.support.raw_http import request, trickle_headers, upload
from tests.support.runs import assert_exact_log, status_of
from tests.support.signin import sign_in_over_http, signed_in_over_http
from tests.support.sse import Event, Stream, auth_headers
from tests.support.threads import DbThread
from tests.support.waiting import wait_until
from tests.support.workers import wait_status

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

MB = 1024 * 1024


@pytest.mark.sqlite
def test_the_template_names_exactly_its_four_variables_and_repeats_the_body_limit() -> None:
    assert template_variables() == set(TEMPLATE_VARIABLES)
    (limit,) = re.findall(r"^\s*client_max_body_size\s+(\d+)k;", TEMPLATE.read_text(), re.MULTILINE)
    assert int(limit) * 1024 == settings.DATA_UPLOAD_MAX_MEMORY_SIZE == 256 * 1024
    values = {name: f"/filled/{name}" for name in TEMPLATE_VARIABLES}
    filled = fill_template(**values)
    assert "${" not in filled
    # nginx's own variables survive the filling.
    assert "$remote_addr" in filled and "$host" in filled
    # The client is the address nginx saw: X-Forwarded-For is set to it, never appended to what a
    # client sent (uvicorn behind the socket takes the header's first entry).
    assert re.findall(r"proxy_set_header X-Forwarded-For (\S+);", filled) == ["$remote_addr"]
    assert "$proxy_add_x_forwarded_for" not in filled


@dataclass
class Front:
    nginx: Nginx
    web: Proc  # uvicorn behind nginx on the front door's socket, access log on, not serving /static/
    worker: Proc
    static_root: Path
    door: Path  # the front door's folder, as deploy/tmpfiles.d/runledger.conf makes it


def web_unit_listener(door: Path) -> tuple[Path, list[str]]:
    """Where runledger-web.service's uvicorn listens, moved into `door` (the test's front door),
    and the options that decide whom it trusts."""
    options = unit_uvicorn("runledger-web.service")
    return door / Path(options["uds"]).name, ["--forwarded-allow-ips", options["forwarded_allow_ips"]]


@pytest.fixture(scope="module")
def front(django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    """The production layout for the whole module (each test makes its own users and runs): the
    front door's folder made by systemd-tmpfiles, one uvicorn in it on the web unit's socket and
    with its trust, nginx from the template in front (its workers `www-data`), one worker, all on
    the test database, with the static files collected for nginx."""
    require_root("to run nginx's workers as www-data, the front door's group")
    registry = Procs(Path(tmp_path_factory.mktemp("deploy")))
    folder = shared_folder("runledger-deploy-")
    try:
        static_root = folder / "static"
        door = front_door(folder / "root")
        with django_db_blocker.unblock():
            env = subprocess_env(RUNLEDGER_SERVE_STATIC="0", RUNLEDGER_STATIC_ROOT=str(static_root))
        collected = run_to_end([sys.executable, "manage.py", "collectstatic", "--noinput"], env)
        assert collected.returncode == 0, collected.stdout + collected.stderr
        socket_path, trust = web_unit_listener(door)
        # Two processes, as the unit's several: uvicorn's supervisor then binds the socket itself.
        web = registry.uvicorn(env=env, access_log=True, uds=socket_path, options=trust, workers=2)
        worker = registry.worker("deploy", env=env)
        nginx = start_nginx(registry, upstream=web, static_root=static_root, prefix=folder / "nginx")
        yield Front(nginx=nginx, web=web, worker=worker, static_root=static_root, door=door)
    finally:
        registry.stop_all()
        shutil.rmtree(folder, ignore_errors=True)


def access_line(web: Proc, marker: str) -> str:
    """The web process's access-log line for the request whose path holds `marker`."""

    def find() -> str | None:
        return next((line for line in web.log().splitlines() if marker in line), None)

    return str(wait_until(find, 10, f"the web process logging {marker}"))


def test_events_pass_through_nginx_as_they_are_committed_and_resume_from_last_event_id(
    front: Front, alice: User
) -> None:
    token = token_for(alice)
    body = json.dumps({"agent": "demo", "input": {"deltas": 30, "delay_ms": 100}}).encode()
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    created = request(front.nginx.address, "/api/runs/", method="POST", headers=headers, body=body)
    assert created.status == 201, created.body
    run = Run.objects.get(pk=json.loads(created.body)["id"])
    total = 2 + 30 + 1  # run.created, run.started, the deltas, run.completed
    path = f"/api/runs/{run.pk}/stream/?after_seq=0"

    async def scenario(db: DbThread) -> tuple[list[Event], list[Event], tuple[str, int]]:
        first: list[Event] = []
        at_first_delta: tuple[str, int] | None = None
        stream = await Stream(front.nginx.url, path, auth_headers(token)).open()
        assert stream.status == 200, stream.body
        async for event in stream.events():
            first.append(event)
            if event.event == "output.delta" and at_first_delta is None:
                at_first_delta = await db.run(lambda: (status_of(run), RunEvent.objects.filter(run=run).count()))
            if event.seq == 12:
                break
        stream.abort()  # dropped mid-run, as a network would
        # Reconnecting as EventSource does: the same URL, and the last id it saw.
        again = await Stream(front.nginx.url, path, auth_headers(token, first[-1].id)).open()
        assert again.status == 200, again.body
        rest = [event async for event in again.events()]
        again.close()
        assert at_first_delta is not None
        return first, rest, at_first_delta

    with DbThread() as db:
        first, rest, (status, stored) = asyncio.run(asyncio.wait_for(scenario(db), 60))

    # The first delta came through while the run was still running, with a fraction of its events
    # stored: nginx passed it on as it came, not when the stream ended (its default, HTTP/1.0 and
    # buffering, delivers them all at the end).
    print(f"at the first delta: {status}, {stored} of {total} events stored")
    assert status == "running"
    assert stored <= total // 2
    lags = [event.received_at - _created(event) for event in first + rest if event.event == "output.delta"]
    print(f"delta lag through nginx: max {max(lags) * 1000:.0f} ms, mean {sum(lags) / len(lags) * 1000:.0f} ms")

    # The second stream started right after the last event the first one dispatched: nothing
    # repeated, nothing missed.
    assert rest[0].seq == first[-1].seq + 1
    run = wait_status(run, "completed")
    assert run.last_seq == total
    assert_exact_log(first + rest, run)

    # Read to its end, the finished run answers 204 through nginx: EventSource stops there.
    async def reconnect() -> Stream:
        return await Stream(front.nginx.url, path, auth_headers(token, str(run.last_seq))).open()

    done = asyncio.run(reconnect())
    assert done.status == 204
    assert done.body == b""


def _created(event: Event) -> float:
    return datetime.fromisoformat(event.json()["created_at"].replace("Z", "+00:00")).timestamp()


def test_nginx_refuses_a_200_mb_upload_right_after_its_headers(front: Front) -> None:
    # (nginx then keeps reading whatever the client still sends, to discard it, for up to its
    # lingering_time: the client is not made to wait for that.)
    answer = upload(front.nginx.address, "/api/runs/?probe=upload-200mb", size=200 * MB, close_wait=0)
    print(f"413 after {answer.sent / MB:.2f} MB of the body, {answer.seconds * 1000:.2f} ms after the headers")
    assert answer.status == 413
    assert answer.sent < 4 * MB
    wait_log_line(front.nginx.proc, "client intended to send too large body", timeout=10)
    assert_never_reached_the_web_process(front, "upload-200mb")


def test_nginx_passes_a_chunked_body_on_with_its_length_and_refuses_one_past_the_limit(
    front: Front, alice: User
) -> None:
    # The web process needs a body's length (DRF reads a body without Content-Length as empty):
    # nginx reads a chunked body whole and passes it on with one.
    headers = {"Authorization": f"Token {token_for(alice)}", "Content-Type": "application/json"}
    body = json.dumps({"agent": "demo", "input": {"deltas": 1, "delay_ms": 1, "pad": "x" * 200_000}}).encode()
    answer = request(front.nginx.address, "/api/runs/", method="POST", headers=headers, body=body, chunked=True)
    assert answer.status == 201, answer.body[:300]
    assert len(json.loads(answer.body)["input"]["pad"]) == 200_000
    wait_status(Run.objects.get(pk=json.loads(answer.body)["id"]), "completed")

    answer = upload(front.nginx.address, "/api/runs/?probe=chunked-64mb", size=64 * MB, chunked=True, close_wait=0)
    print(f"chunked: 413 after {answer.sent / 1024:.0f} KiB")
    assert answer.status == 413
    assert answer.sent < 4 * MB
    wait_log_line(front.nginx.proc, "client intended to send too large chunked body", timeout=10)
    assert_never_reached_the_web_process(front, "chunked-64mb")


def assert_never_reached_the_web_process(front: Front, probe: str) -> None:
    # A later request through nginx reaches the web process's access log; the refused one does not.
    request(front.nginx.address, f"/healthz/?probe=after-{probe}")
    access_line(front.web, f"probe=after-{probe}")
    assert f"probe={probe}" not in front.web.log()


def test_nginx_closes_a_half_sent_request_within_its_header_timeout(front: Front) -> None:
    # The client keeps sending header lines, one a second, and never ends them: the timeout is for
    # the whole header, not between two reads.
    trickled = trickle_headers(front.nginx.address, "/healthz/?probe=slowloris", every=1.0, timeout=30)
    print(f"closed after {trickled.seconds:.1f} s and {trickled.lines} header lines; got {trickled.received!r}")
    assert 9 <= trickled.seconds < 15
    assert trickled.lines >= 8
    assert "probe=slowloris" not in front.web.log()


def test_static_files_come_from_nginx_and_not_from_the_web_process(front: Front) -> None:
    path = "/static/admin/css/base.css"
    through_nginx = request(front.nginx.address, path)
    assert through_nginx.status == 200
    assert through_nginx.body == (front.static_root / "admin" / "css" / "base.css").read_bytes()
    assert through_nginx.headers["content-type"].startswith("text/css")
    # The web process does not serve them (RUNLEDGER_SERVE_STATIC=0), and logged only this request.
    assert front.web.uds is not None
    direct = request(front.web.uds, path)
    assert direct.status == 404
    access_line(front.web, f'"GET {path} HTTP/1.1" 404')
    assert front.web.log().count(f'"GET {path} ') == 1


def test_the_web_process_sees_the_client_address_through_nginx(front: Front) -> None:
    # From another loopback address, with a forged X-Forwarded-For of its own: nginx sets the header
    # to the address it saw, and uvicorn, behind the socket, takes that.
    answer = request(
        front.nginx.address,
        "/healthz/?probe=client-address",
        source="127.0.0.2",
        headers={"X-Forwarded-For": "203.0.113.9, 127.0.0.1"},
    )
    assert answer.status == 200
    line = access_line(front.web, "probe=client-address")
    assert line.split()[1].startswith("127.0.0.2:"), line
    assert "203.0.113.9" not in line
    wait_until(lambda: "127.0.0.2 - " in front.nginx.access_log(), 10, "nginx logging the client's address")


def test_failed_token_attempts_through_nginx_are_counted_per_client_whatever_it_forwards(
    front: Front, alice: User
) -> None:
    # Every request reaches the web process from nginx; counted per proxy, one guesser would lock
    # every client out; counted per forwarded address, a guesser would name a new one each time.
    bad = {"Authorization": "Token " + "0" * 40}
    for i in range(10):  # RUNLEDGER_AUTH_FAILURES_MAX's default
        forged = {**bad, "X-Forwarded-For": f"203.0.113.{i}"}
        assert request(front.nginx.address, "/api/runs/", source="127.0.0.2", headers=forged).status == 401
    good = {"Authorization": f"Token {token_for(alice)}"}
    blocked = request(front.nginx.address, "/api/runs/", source="127.0.0.2", headers=good)
    assert blocked.status == 429 and int(blocked.headers["retry-after"]) >= 1
    forged = request(
        front.nginx.address, "/api/runs/", source="127.0.0.2", headers={**good, "X-Forwarded-For": "203.0.113.99"}
    )
    assert forged.status == 429
    assert request(front.nginx.address, "/api/runs/", source="127.0.0.3", headers=good).status == 200


def test_failed_sign_ins_through_nginx_are_counted_per_client_whatever_it_forwards(front: Front) -> None:
    give_password(User.objects.create_user("frontdoor"), "the-right-one")
    page = "/accounts/login/"

    def sign_in(password: str, source: str, forged: str) -> Any:
        headers = {"X-Forwarded-For": forged, "X-Real-IP": forged}
        return sign_in_over_http(front.nginx.url, page, "frontdoor", password, source=source, headers=headers)

    for i in range(10):
        assert sign_in("a-guess", "127.0.0.4", f"198.51.100.{i}").status_code == 200  # the form again
    # Were each failure counted for the address it forwarded, this one (a new address, which never
    # failed for the username) would sign in: the username is blocked only from those addresses.
    refused = sign_in("the-right-one", "127.0.0.4", "198.51.100.200")
    assert refused.status_code == 429 and not signed_in_over_http(refused)
    # The account's owner, from an address of her own, still signs in (no lockout by strangers).
    assert signed_in_over_http(sign_in("the-right-one", "127.0.0.5", "198.51.100.1"))


AS_ANOTHER_USER = r"""
import json, socket, sys
probe, found = sys.argv[1], {}
for target in sys.argv[2:]:
    try:
        if target.startswith("/"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(10)
            sock.connect(target)
        else:
            sock = socket.create_connection(("127.0.0.1", int(target)), timeout=10)
        with sock:
            sock.sendall(b"GET /healthz/?probe=%s HTTP/1.1\r\nHost: localhost\r\nX-Forwarded-For: 192.0.2.1\r\n"
                         b"Connection: close\r\n\r\n" % probe.encode())
            found[target] = sock.recv(64).decode(errors="replace").split("\r\n")[0]
    except OSError as exc:
        found[target] = type(exc).__name__
print(json.dumps(found))
"""


def connect_as(user: str, probe: str, *targets: Path | int) -> list[str]:
    """What a process of local user `user` (with its own groups only) got from a GET /healthz/?probe=
    `probe` with a forged X-Forwarded-For to each of `targets` (a Unix socket, or a loopback port):
    the answer's status line, or the error that refused its connection."""
    found = json.loads(python_as(user, AS_ANOTHER_USER, probe, *map(str, targets)))
    return [found[str(target)] for target in targets]


def test_only_nginx_reaches_the_web_processes(front: Front) -> None:
    # The folder as systemd-tmpfiles made it from the shipped line: nginx's group may enter, others not.
    door = front.door.stat()
    assert (stat.S_IMODE(door.st_mode), door.st_gid) == (0o750, grp.getgrnam("www-data").gr_gid)
    # uvicorn listens on no TCP port at all: there is no loopback port to forge X-Forwarded-For on.
    assert front.web.uds is not None and front.web.port is None
    assert listening_tcp_ports([front.web.pid, *descendants(front.web.pid)]) == set()
    # Its socket is open to all (uvicorn's chmod): the folder is what decides. Another local user is
    # refused by it; nginx's workers' user gets in, as nginx does.
    assert stat.S_IMODE(front.web.uds.stat().st_mode) == 0o666
    assert connect_as("www-data", "as-nginx", front.web.uds) == ["HTTP/1.1 200 OK"]
    # nobody's one way in is nginx's port, as any client, under its own address.
    assert connect_as("nobody", "as-nobody", front.web.uds, front.nginx.address[1]) == [
        "PermissionError",
        "HTTP/1.1 200 OK",
    ]
    line = access_line(front.web, "probe=as-nobody")
    assert line.split()[1].startswith("127.0.0.1:") and "192.0.2.1" not in line, line


@pytest.mark.edge
def test_behind_the_edges_socket_the_client_is_the_one_nginx_saw_whatever_anyone_forwards(
    procs: Procs, alice: User
) -> None:
    """The edge's layout (docs/how-to/edge.md#front-door): nginx sends the streams to Pushpin on a
    socket in the front door's folder, Pushpin to the edge's web processes on loopback (it reaches
    no Unix socket), which trust no forwarded header but on a request Pushpin signed."""
    require_root("to run nginx's workers as www-data, the front door's group, and to connect as nobody")
    folder = shared_folder("runledger-edge-door-")
    try:
        door = front_door(folder / "root")
        control = control_socket()
        # As runledger-edge-origin.service starts it (test_the_systemd_units_...): no forwarded header trusted.
        origin = procs.uvicorn(env=edge_env(control), options=["--no-proxy-headers"])
        wait_leading(origin)
        socket_path, trust = web_unit_listener(door)
        web = procs.uvicorn(env=edge_env(control), uds=socket_path, options=trust)
        edge = start_edge(procs, upstream=origin, control=control, port=door / "stream.sock")
        (folder / "static").mkdir()
        nginx = start_nginx(
            procs, upstream=web, stream_upstream=edge.proc, static_root=folder / "static", prefix=folder / "nginx"
        )
        procs.worker("door-worker")
        run = wait_status(queued_run(alice, input={"deltas": 2, "delay_ms": 1}), "completed")
        path = f"/api/runs/{run.pk}/stream/?after_seq=0"
        good = {"Authorization": f"Token {token_for(alice)}"}
        bad = {"Authorization": "Token " + "0" * 40}

        # Pushpin's socket is open to all once ready; the folder keeps other local users out.
        assert edge.proc.uds is not None and stat.S_IMODE(edge.proc.uds.stat().st_mode) == 0o666
        assert connect_as("nobody", "edge-as-nobody", edge.proc.uds) == ["PermissionError"]

        # Through nginx and the edge, ten bad tokens from one client, each forwarding another
        # address: counted for the client, whose good token is then refused too; another client's is not.
        for i in range(10):
            forged = {**bad, "X-Forwarded-For": f"203.0.113.{i}"}
            assert request(nginx.address, path, source="127.0.1.2", headers=forged).status == 401
        assert request(nginx.address, path, source="127.0.1.2", headers=good).status == 429
        assert request(nginx.address, path, source="127.0.1.3", headers=good).status == 200
        assert f"/api/runs/{run.pk}/stream/" in edge.log()  # they went through Pushpin

        # A local user straight to the loopback port, forwarding the address of a client of nginx's:
        # counted for itself, the peer, not for the client it named.
        assert origin.port is not None
        for _ in range(10):
            forged = {**bad, "X-Forwarded-For": "127.0.1.4"}
            assert request(("127.0.0.1", origin.port), path, source="127.0.1.5", headers=forged).status == 401
        assert request(nginx.address, path, source="127.0.1.4", headers=good).status == 200
        assert request(("127.0.0.1", origin.port), path, source="127.0.1.5", headers=good).status == 429
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.edge
def test_runedge_takes_a_socket_for_clients_in_a_closed_folder_and_never_one_upstream(tmp_path: Path) -> None:
    control = tmp_path / "control" / "socket"
    open_folder = shared_folder("runledger-open-")
    try:
        runedge = [sys.executable, "manage.py", "runedge", "--control", str(control)]
        # A socket open to all in a folder others may enter would let any local user through Pushpin,
        # which signs what it passes on: refused before Pushpin starts.
        done = run_to_end(
            [*runedge, "--port", f"unix:{open_folder}/s.sock", "--upstream", "127.0.0.1:1"], subprocess_env()
        )
        assert done.returncode != 0 and "would be open to others" in done.stderr, done.stderr
        assert "chmod 750" in done.stderr and not (open_folder / "s.sock").exists()
        # Pushpin 1.36 reaches no Unix socket: said so, not started.
        done = run_to_end(
            [*runedge, "--port", "127.0.0.1:1", "--upstream", "unix:/run/runledger/web.sock"], subprocess_env()
        )
        assert done.returncode != 0 and "reaches the web processes over TCP only" in done.stderr, done.stderr
    finally:
        shutil.rmtree(open_folder, ignore_errors=True)
