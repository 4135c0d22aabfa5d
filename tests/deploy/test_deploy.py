"""Production (docs/design/operations.md#deploy, deploy/): settings that refuse an unsafe start, a
real nginx started from deploy/nginx.conf.template in front of uvicorn and a worker in the front
door's layout (docs/how-to/deploy.md#front-door: uvicorn on a Unix socket in the folder
deploy/tmpfiles.d/runledger.conf makes, nginx the only way in, the SSE edge on a socket beside it),
the app's own body limit without it, and the systemd units.

The settings proofs start processes with nothing of the suite's environment: only PATH and the
variables an operator sets, on the embedded default database (no DATABASE_URL).
"""

import asyncio
import contextlib
import grp
import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import load_command_class
from uvicorn.main import main as uvicorn_command

from runs import services
from runs.conf import conf
from runs.models import Run, RunAttempt, RunEvent
from tests.factories import queued_run
from tests.support.browser import give_password
from tests.support.db import token_for
from tests.support.edge import control_socket, edge_env, listening_tcp_ports, start_edge, wait_leading
from tests.support.nginx import (
    TEMPLATE,
    TEMPLATE_VARIABLES,
    TMPFILES,
    Nginx,
    fill_template,
    front_door,
    shared_folder,
    start_nginx,
    template_variables,
)
from tests.support.procs import (
    ROOT,
    Proc,
    Procs,
    descendants,
    free_port,
    python_as,
    require_root,
    subprocess_env,
    wait_log_line,
)
from tests.support.raw_http import request, trickle_headers, upload
from tests.support.runs import assert_exact_log, status_of
from tests.support.signin import sign_in_over_http, signed_in_over_http
from tests.support.sse import Event, Stream, auth_headers
from tests.support.threads import DbThread
from tests.support.waiting import wait_until
from tests.support.workers import wait_status

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

PUBLIC_HOST = "runledger.example.com"
MB = 1024 * 1024


def operator_env(**values: str) -> dict[str, str]:
    """What a process started by hand gets: PATH and `values`, nothing of the suite's environment
    (no DATABASE_URL: the embedded SQLite default)."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **values}


def run_to_end(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # Bounded: a server that started after all is stopped by the timeout (and the test fails).
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


# --- settings -------------------------------------------------------------------------------------


@pytest.mark.sqlite
def test_a_public_host_without_a_secret_key_stops_every_command_and_the_server(tmp_path: Path) -> None:
    key_file = tmp_path / "local-secret-key"
    env = operator_env(DJANGO_ALLOWED_HOSTS=f"localhost,{PUBLIC_HOST}", RUNLEDGER_LOCAL_SECRET_FILE=str(key_file))
    for args in (
        [sys.executable, "manage.py", "check"],
        [sys.executable, "manage.py", "runworker"],
        [sys.executable, "-m", "uvicorn", "config.asgi:application", "--port", str(free_port())],
    ):
        done = run_to_end(args, env)
        assert done.returncode != 0, (args, done.stdout, done.stderr)
        assert f"DJANGO_SECRET_KEY must be set: DJANGO_ALLOWED_HOSTS allows {PUBLIC_HOST}" in done.stderr, args
    assert not key_file.exists()  # a public deployment never falls back to a local key


@pytest.mark.sqlite
def test_check_deploy_passes_with_the_four_documented_variables() -> None:
    documented = {
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DJANGO_ALLOWED_HOSTS": PUBLIC_HOST,
        "DJANGO_CSRF_TRUSTED_ORIGINS": f"https://{PUBLIC_HOST}",
        "DJANGO_SECURE_HTTPS": "1",
    }
    check = [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"]
    done = run_to_end(check, operator_env(**documented))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout

    # The same check fails without DJANGO_SECURE_HTTPS: it does look at the security settings.
    documented.pop("DJANGO_SECURE_HTTPS")
    done = run_to_end(check, operator_env(**documented))
    assert done.returncode != 0
    assert {"security.W004", "security.W008", "security.W012", "security.W016"} <= set(
        re.findall(r"security\.W\d+", done.stdout + done.stderr)
    )


@pytest.mark.sqlite
def test_the_embedded_default_keeps_a_random_local_key_of_its_own(procs: Procs, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    print_key = [sys.executable, "-c", "from django.conf import settings; print(settings.SECRET_KEY)"]

    def keys_of(key_file: Path, processes: int) -> set[str]:
        env = operator_env(DJANGO_SETTINGS_MODULE="config.settings", RUNLEDGER_LOCAL_SECRET_FILE=str(key_file))
        started = [procs.start("print-key", print_key, env) for _ in range(processes)]
        for proc in started:
            proc.wait_exit(timeout=60)
        return {proc.log().strip() for proc in started}

    # Processes starting at once on no key yet: one key is made, and every process reads it whole.
    first = keys_of(keys / "secret-key", 4)
    assert len(first) == 1
    (key,) = first
    assert key == (keys / "secret-key").read_text().strip()
    assert len(key) >= 50
    assert stat.S_IMODE((keys / "secret-key").stat().st_mode) == 0o600
    # Kept: a later process gets the same key.
    assert keys_of(keys / "secret-key", 1) == {key}
    # Random, not a constant of the code: another file, another key.
    (other,) = keys_of(keys / "another-key", 1)
    assert other != key
    assert key not in (ROOT / "config" / "settings.py").read_text()
    assert sorted(path.name for path in keys.iterdir()) == ["another-key", "secret-key"]  # nothing left beside


# --- nginx in front -------------------------------------------------------------------------------


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


def unit_uvicorn(name: str) -> dict[str, Any]:
    """The options of the uvicorn that unit `name` starts, as uvicorn's own parser reads them."""
    program, args = exec_start(unit_settings(ROOT / "deploy" / name)["Service"])
    assert program == "uvicorn", name
    return dict(uvicorn_command.make_context("uvicorn", args).params)


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


# --- without nginx --------------------------------------------------------------------------------


@dataclass
class BareWeb:
    web: Proc
    tmpdir: Path  # its TMPDIR, where Django would spool request bodies


@pytest.fixture(scope="module")
def bare(django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BareWeb]:
    """uvicorn alone, as in a deployment without a proxy, with an empty temporary folder of its own."""
    registry = Procs(Path(tmp_path_factory.mktemp("bare")))
    tmpdir = Path(tmp_path_factory.mktemp("bare-tmpdir"))
    try:
        with django_db_blocker.unblock():
            # Its metrics files (by default under TMPDIR) elsewhere: that folder is for spooled bodies only.
            metrics = tmp_path_factory.mktemp("bare-metrics")
            env = subprocess_env(TMPDIR=str(tmpdir), RUNLEDGER_METRICS_DIR=str(metrics))
        yield BareWeb(web=registry.uvicorn(env=env), tmpdir=tmpdir)
    finally:
        registry.stop_all()


def open_files_under(pid: int, folder: Path) -> list[str]:
    """Files the process holds open in `folder` (an unnamed O_TMPFILE shows as `folder/#inode`)."""
    found = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith(str(folder)):
                found.append(target)
    return found


def assert_nothing_spooled(bare: BareWeb) -> None:
    assert list(bare.tmpdir.iterdir()) == []
    assert open_files_under(bare.web.pid, bare.tmpdir) == []


def assert_payload_too_large(answer: Any) -> None:
    assert answer.status == 413
    assert answer.headers["connection"] == "close"
    assert answer.headers["content-type"] == "application/json"
    error = json.loads(answer.body)["error"]
    assert error["code"] == "payload_too_large"
    assert error["detail"] == {"limit_bytes": settings.DATA_UPLOAD_MAX_MEMORY_SIZE}
    assert answer.closed  # the unread body is never read: the connection goes with the answer


@pytest.mark.sqlite
def test_without_nginx_a_declared_body_over_the_limit_is_refused_at_once_unread(bare: BareWeb) -> None:
    assert bare.web.port is not None
    # An anonymous client declares 1.5 GB and sends only its headers.
    answer = upload(("127.0.0.1", bare.web.port), "/api/runs/", size=1_500_000_000, body_bytes=0)
    print(f"413 in {answer.seconds * 1000:.2f} ms")
    assert_payload_too_large(answer)
    assert answer.seconds < 2
    assert_nothing_spooled(bare)


@pytest.mark.sqlite
def test_without_nginx_a_chunked_body_is_refused_once_it_passes_the_limit(bare: BareWeb) -> None:
    assert bare.web.port is not None
    # 16 MB/s: the bound below then leaves the server 150 ms to answer, on a busy machine too.
    answer = upload(("127.0.0.1", bare.web.port), "/api/runs/", size=64 * MB, chunked=True, chunk_size=16 * 1024)
    print(f"413 after {answer.sent / 1024:.0f} KiB of the chunked body")
    assert_payload_too_large(answer)
    # Answered before the client had sent as much as Django keeps in memory before it spools to
    # disk (FILE_UPLOAD_MAX_MEMORY_SIZE): whatever the server read, none of it reached a file.
    assert settings.DATA_UPLOAD_MAX_MEMORY_SIZE < answer.sent < settings.FILE_UPLOAD_MAX_MEMORY_SIZE
    assert_nothing_spooled(bare)


@pytest.mark.sqlite
def test_without_nginx_a_body_under_the_limit_is_served(bare: BareWeb, alice: User) -> None:
    assert bare.web.port is not None
    headers = {"Authorization": f"Token {token_for(alice)}", "Content-Type": "application/json"}
    body = json.dumps({"agent": "demo", "input": {"deltas": 1, "pad": "x" * 200_000}}).encode()
    assert len(body) < settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    answer = request(("127.0.0.1", bare.web.port), "/api/runs/", method="POST", headers=headers, body=body)
    assert answer.status == 201, answer.body[:300]
    created = json.loads(answer.body)
    assert len(created["input"]["pad"]) == 200_000
    assert_nothing_spooled(bare)
    # The module's worker (`front`, when it is up) takes this run too: end it, and let the worker
    # let go of it, so that no transaction of the worker's meets the database's flush after the test.
    services.run_cancel(run_id=created["id"], actor=alice)
    wait_until(
        lambda: not RunAttempt.objects.filter(run_id=created["id"], released_at__isnull=True).exists(),
        what="the run's attempt released",
    )


# --- the systemd units ----------------------------------------------------------------------------

UNITS = {
    "runledger-web.service",
    "runledger-worker@.service",
    "runledger-edge.service",
    "runledger-edge-origin.service",
}
# The units whose processes count metrics (GET /metrics/ adds up every process's counters).
COUNTING = {"runledger-web.service", "runledger-worker@.service", "runledger-edge-origin.service"}
# The front door's folder, and its line in deploy/tmpfiles.d/runledger.conf.
DOOR = "/run/runledger"
CHECKOUT = "/srv/runledger"  # where the units expect the project


# The sandbox every unit sets, beside NoNewPrivileges, ProtectSystem and PrivateTmp above.
SANDBOX = {
    "UMask": "0077",
    "ProtectHome": "yes",
    "PrivateDevices": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "ProtectClock": "yes",
    "ProtectHostname": "yes",
    "ProtectProc": "invisible",
    "RestrictNamespaces": "yes",
    "RestrictRealtime": "yes",
    "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes",
    "CapabilityBoundingSet": "",
    "SystemCallArchitectures": "native",
    "SystemCallFilter": "@system-service",
}


def unit_settings(path: Path) -> dict[str, dict[str, list[str]]]:
    """section → key → values (systemd allows a key more than once)."""
    sections: dict[str, dict[str, list[str]]] = {}
    section: dict[str, list[str]] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = sections.setdefault(line[1:-1], {})
            continue
        key, equals, value = line.partition("=")
        assert equals, f"{path.name}: not a setting: {raw!r}"
        section.setdefault(key.strip(), []).append(value.strip())
    return sections


def exec_start(service: dict[str, list[str]]) -> tuple[str, list[str]]:
    """The program (as in this checkout's virtualenv) and arguments of a unit's one ExecStart."""
    (command,) = service["ExecStart"]
    program, *args = command.split()
    assert program.startswith(f"{CHECKOUT}/.venv/bin/"), program
    local = Path(sys.executable).parent / Path(program).name
    assert local.exists(), f"{program}: no {local.name} in the virtualenv"
    return local.name, args


@pytest.mark.sqlite
def test_the_systemd_units_start_the_projects_own_commands_and_stop_them_gracefully() -> None:
    assert {path.name for path in (ROOT / "deploy").glob("*.service")} == UNITS
    units = {name: unit_settings(ROOT / "deploy" / name) for name in UNITS}
    for name, unit in units.items():
        service = unit["Service"]
        for key, value in {
            "User": "runledger",
            "WorkingDirectory": CHECKOUT,
            "EnvironmentFile": "/etc/runledger/env",
            "KillSignal": "SIGTERM",
            "KillMode": "mixed",
            "Restart": "on-failure",
            **SANDBOX,
        }.items():
            assert service.get(key) == [value], (name, key)
        assert unit["Install"]["WantedBy"] == ["multi-user.target"], name
        # Thousands of streams need thousands of files (systemd's default soft limit is 1,024);
        # memory and tasks are bounded.
        assert int(service["LimitNOFILE"][0]) >= 65536, name
        assert re.fullmatch(r"\d+[KMG]", service["MemoryMax"][0]), name
        assert 0 < int(service["TasksMax"][0]) <= 4096, name
    for name in COUNTING:
        service = units[name]["Service"]
        # Their /tmp is private: both name one metrics directory, kept across restarts, private.
        assert service["RuntimeDirectory"] == ["runledger-metrics"], name
        assert service["RuntimeDirectoryPreserve"] == ["yes"], name
        assert service["RuntimeDirectoryMode"] == ["0700"], name
        assert "RUNLEDGER_METRICS_DIR=/run/runledger-metrics" in service["Environment"], name

    # The web unit: uvicorn's own parser takes its arguments; the application is config.asgi's. It
    # listens on a socket in the front door's folder and nowhere else, and believes the
    # X-Forwarded-For of whoever connects there: only nginx may (test_only_nginx_reaches_the_web_processes).
    web = units["runledger-web.service"]["Service"]
    _, args = exec_start(web)
    options = unit_uvicorn("runledger-web.service")
    assert options["app"] == "config.asgi:application"
    assert re.search(r"^application\b", (ROOT / "config" / "asgi.py").read_text(), re.MULTILINE)
    assert str(Path(options["uds"]).parent) == DOOR and not {"--host", "--port", "--fd"} & set(args)
    assert options["forwarded_allow_ips"] == "*" and options["proxy_headers"]
    assert web["ReadWritePaths"] == [DOOR] and web["ExecStartPre"] == [f"-/usr/bin/rm -f {options['uds']}"]
    assert options["workers"] > 1
    assert options["timeout_graceful_shutdown"] < int(web["TimeoutStopSec"][0])
    (door,) = [line.split() for line in TMPFILES.read_text().splitlines() if line and not line.startswith("#")]
    assert door == ["d", DOOR, "0750", "runledger", "www-data", "-"]
    assert re.search(r"^user www-data www-data;$", TEMPLATE.read_text(), re.MULTILINE)  # nginx's workers: the group

    # The worker unit: manage.py runworker, whose own parser takes its arguments; systemd waits
    # longer than the worker's shutdown grace before it kills a worker still requeueing its runs.
    worker = units["runledger-worker@.service"]["Service"]
    program, args = exec_start(worker)
    assert program == "python"
    assert args[:2] == ["manage.py", "runworker"] and (ROOT / args[0]).exists()
    load_command_class("runs", "runworker").create_parser("manage.py", "runworker").parse_args(args[2:])
    assert int(worker["TimeoutStopSec"][0]) > conf.SHUTDOWN_GRACE_SECONDS + 5

    # The edge unit: what bin/edge runs, manage.py runedge, whose own parser takes its arguments;
    # nginx reaches it through a socket in the front door's folder, and it reaches the edge's own
    # web processes on loopback (Pushpin 1.36 reaches no Unix socket), which trust no forwarded
    # header; its control socket in a folder only its user enters. SIGTERM to runedge alone
    # (KillMode=mixed, above), which passes it on to Pushpin once (tests/test_edge.py).
    edge = units["runledger-edge.service"]["Service"]
    program, args = exec_start(edge)
    assert program == "python"
    assert args[:2] == ["manage.py", "runedge"] and "manage.py runedge" in (ROOT / "bin" / "edge").read_text()
    parser = load_command_class("runs", "runedge").create_parser("manage.py", "runedge")
    edge_options = vars(parser.parse_args(args[2:]))
    origin = unit_uvicorn("runledger-edge-origin.service")
    assert edge_options["upstream"] == f"{origin['host']}:{origin['port']}" and origin["host"] == "127.0.0.1"
    assert origin["proxy_headers"] is False and origin["app"] == "config.asgi:application"
    assert str(Path(edge_options["port"].removeprefix("unix:")).parent) == DOOR and edge["ReadWritePaths"] == [DOOR]
    assert edge_options["control"] == "/run/runledger-edge/control"
    assert edge["RuntimeDirectory"] == ["runledger-edge"] and edge["RuntimeDirectoryMode"] == ["0700"]

    # bin/run, for development on loopback, trusts no forwarded header either (its shell's defaults
    # filled in).
    (command,) = re.findall(
        r"\.venv/bin/uvicorn (config\.asgi:.*?) &$", (ROOT / "bin" / "run").read_text(), re.S | re.M
    )
    args = re.sub(r'"\$\{\w+:-([^}]*)\}"', r"\1", command.replace("\\\n", " ")).split()
    assert uvicorn_command.make_context("uvicorn", args).params["proxy_headers"] is False


@pytest.mark.sqlite
@pytest.mark.timeout(60)
def test_systemd_reads_each_unit_without_a_complaint_and_rates_its_exposure_ok() -> None:
    for name in sorted(UNITS):
        path = str(ROOT / "deploy" / name)
        verified = subprocess.run(["systemd-analyze", "verify", path], capture_output=True, text=True, timeout=30)
        # The one complaint expected here: the checkout is not in /srv/runledger on this machine.
        complaints = [line for line in verified.stderr.splitlines() if "is not executable" not in line]
        assert complaints == [], (name, complaints)
        rated = subprocess.run(
            ["systemd-analyze", "security", "--offline=true", path], capture_output=True, text=True, timeout=30
        )
        found = re.search(r"Overall exposure level for \S+: (\d+\.\d) (\w+)", rated.stdout)
        assert found is not None, rated.stdout + rated.stderr
        # systemd's scale: 0 (exposed to nothing) to 10; "OK" is below 2.
        assert (float(found[1]), found[2]) <= (2.0, "OK") and found[2] == "OK", (name, found[0])
