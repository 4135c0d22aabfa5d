"""The systemd units of deploy/ (docs/design/operations.md#deploy): they start the project's own
commands, stop them gracefully and sandbox them, and systemd reads each without a complaint."""

import re
import subprocess
from pathlib import Path

import pytest
from django.core.management import load_command_class
from uvicorn.main import main as uvicorn_command

from runs.conf import conf
from tests.support.deploy import CHECKOUT, exec_start, unit_settings, unit_uvicorn
from tests.support.nginx import TEMPLATE, TMPFILES
from tests.support.procs import ROOT

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


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
    # (KillMode=mixed, above), which passes it on to Pushpin once (tests/edge/test_bin_edge.py).
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
