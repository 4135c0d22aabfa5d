"""Pushpin in the foreground, with a configuration of its own (`bin/edge`, `manage.py runedge`).

Debian's Pushpin 1.36 expects system services (zurl's sockets under /var/run/zurl, fixed ZeroMQ
ports 5560-5563, logs in /var/log): the configuration written here starts every part of it under
its runner from one private folder instead — its own zurl, ZeroMQ sockets as files in that folder,
only the client port and the control port on TCP — so any user can run any number of them side by
side (shared/research/edge-metrics-proxy.md §A1). Its key is `RUNLEDGER_GRIP_KEY`, read from the
settings as the web processes read it.
"""

import contextlib
import os
import re
import resource
import shutil
import tempfile
from pathlib import Path

# Streams one Pushpin holds at most (its default).
MAX_CONNECTIONS = 50_000
# The largest publish body it takes; the publisher's bodies stay far below, bar one huge event.
MAX_PUBLISH_BYTES = 64 * 1024 * 1024


def config_text(*, port: str, control_port: str, run_dir: Path, key: str, log_level: int) -> str:
    """pushpin.conf: everything under `run_dir`; `port` and `control_port` as [address:]port."""
    control_addr, _, control = control_port.rpartition(":")
    return f"""\
[global]
include={{libdir}}/internal.conf
rundir={run_dir}
ipc_prefix=edge-

[runner]
# zurl too: Debian's Pushpin expects a system one, which an unprivileged run does not have.
services=condure,zurl,pushpin-proxy,pushpin-handler
http_port={port}
logdir={run_dir}/log
log_level={log_level}
client_buffer_size=8192
client_maxconn={MAX_CONNECTIONS}

[proxy]
routesfile=routes
sig_iss=pushpin
sig_key={key}
# The client's address for the web processes (uvicorn reads X-Forwarded-For from 127.0.0.1), and
# the scheme a TLS proxy in front of this one saw.
x_forwarded_for=append
accept_x_forwarded_protocol=true
set_x_forwarded_protocol=proto-only
updates_check=off
zurl_out_specs=ipc://{{rundir}}/{{ipc_prefix}}zurl-in
zurl_out_stream_specs=ipc://{{rundir}}/{{ipc_prefix}}zurl-in-stream
zurl_in_specs=ipc://{{rundir}}/{{ipc_prefix}}zurl-out

[handler]
push_in_spec=ipc://{{rundir}}/{{ipc_prefix}}push-in
push_in_sub_specs=ipc://{{rundir}}/{{ipc_prefix}}push-in-sub
command_spec=ipc://{{rundir}}/{{ipc_prefix}}handler-command
stats_spec=ipc://{{rundir}}/{{ipc_prefix}}stats
# The control port: publish and recover. It has no authentication: keep it on a private address.
push_in_http_addr={control_addr or "127.0.0.1"}
push_in_http_port={control}
push_in_max_body_size={MAX_PUBLISH_BYTES}
# One event reaches ten thousand watchers at once: no rate limit on sending to subscribers.
message_rate=-1
message_hwm=1000000
# Runledger publishes each run's events in order from one publisher, so an event out of order
# means one was lost: wait a second for it, not five, before the streams fetch it themselves.
message_wait=1000
# A publish repeated within this many seconds (a new leader's first) is dropped.
id_cache_ttl=60
connection_subscription_max=20
subscription_linger=60
"""


def prepare(*, port: str, control_port: str, upstream: str, key: str, log_level: int) -> Path:
    """The folder of the Pushpin on `port`, holding pushpin.conf and routes (its sockets come
    later). One per port, made anew at each start: whatever a stopped one left there is removed,
    and two Pushpins cannot share a port anyway."""
    run_dir = Path(tempfile.gettempdir()) / f"runledger-edge-{os.getuid()}-{re.sub(r'[^0-9A-Za-z.]', '_', port)}"
    shutil.rmtree(run_dir, ignore_errors=True)
    # Its own, and only its user's: the configuration holds the signing key. A folder of that
    # name left by another user (or a link planted there) makes this fail instead.
    run_dir.mkdir(mode=0o700)
    (run_dir / "log").mkdir()
    (run_dir / "pushpin.conf").write_text(
        config_text(port=port, control_port=control_port, run_dir=run_dir, key=key, log_level=log_level)
    )
    # Every path to the web processes; one target (several would be failover, not balancing).
    (run_dir / "routes").write_text(f"* {upstream}\n")
    return run_dir


def _enough_files() -> None:
    """As many open files as the holder of tens of thousands of sockets needs; Pushpin's parts
    inherit it. Only root may raise the hard limit; anyone else goes as far as it allows."""
    want = 2 * MAX_CONNECTIONS + 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
            return
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def run(*, port: str, control_port: str, upstream: str, key: str, log_level: int = 2) -> None:
    """Become Pushpin (exec), in the foreground. Its runner stops every part of it on SIGTERM or
    SIGINT and exits 0; being this very process, it gets the signal as sent, once, with nothing in
    between to pass it on (a second SIGTERM makes the runner kill its parts instead of stopping them)."""
    binary = shutil.which("pushpin")
    if binary is None:
        raise FileNotFoundError("pushpin is not installed (Debian: apt-get install pushpin; bin/edge does it)")
    run_dir = prepare(port=port, control_port=control_port, upstream=upstream, key=key, log_level=log_level)
    _enough_files()
    print(f"Pushpin on {port}, control on {control_port}, in front of {upstream} (pid {os.getpid()})", flush=True)
    # -m: the logs of every part on this process's output, not in files nobody reads.
    os.execv(binary, [binary, f"--config={run_dir / 'pushpin.conf'}", "-m"])
