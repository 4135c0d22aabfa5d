"""Debian's nginx in front of a web process (and of the SSE edge, for the streams), started from
deploy/nginx.conf.template as an operator would: the template filled by `envsubst` naming its variables, then `nginx -p PREFIX -c
PREFIX/nginx.conf`, in the foreground (the template says `daemon off`) under `Procs`.

Started as root (as in CI), nginx runs its workers as `www-data`, who must be able to enter its
folder and read the static files: `shared_folder()` makes one outside pytest's tmp_path, which only
its owner may enter. Upstreams on a Unix socket it reaches as `unix:PATH`."""

import os
import pwd
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.support.procs import ROOT, Proc, Procs, free_port, wait_http_ok

TEMPLATE = ROOT / "deploy" / "nginx.conf.template"
TMPFILES = ROOT / "deploy" / "tmpfiles.d" / "runledger.conf"
TEMPLATE_VARIABLES = ("LISTEN_PORT", "UPSTREAM", "STREAM_UPSTREAM", "STATIC_ROOT", "NGINX_PREFIX")


def nginx_binary() -> str:
    # Debian installs it in /usr/sbin, which a non-root PATH may leave out.
    return shutil.which("nginx") or "/usr/sbin/nginx"


def template_variables() -> set[str]:
    """The `${NAME}` variables the template uses (nginx's own `$host` and the like have no braces)."""
    return set(re.findall(r"\$\{(\w+)\}", TEMPLATE.read_text()))


def shared_folder(prefix: str) -> Path:
    """A new folder that every user may enter and read (nginx's workers run as `www-data`); the
    caller removes it."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o755)
    return folder


def front_door(root: Path) -> Path:
    """The front door's folder (/run/runledger) made under `root` by systemd-tmpfiles from
    deploy/tmpfiles.d/runledger.conf, as at boot: `root` holds the users it names, `runledger` as
    this process's user and `www-data` as this machine's (nginx's workers). Its path."""
    www = pwd.getpwnam("www-data")
    (root / "etc").mkdir(parents=True)
    me = os.getuid(), os.getgid()
    (root / "etc" / "passwd").write_text(
        f"runledger:x:{me[0]}:{me[1]}::/srv/runledger:/bin/false\nwww-data:x:{www.pw_uid}:{www.pw_gid}::/:/bin/false\n"
    )
    (root / "etc" / "group").write_text(f"runledger:x:{me[1]}:\nwww-data:x:{www.pw_gid}:\n")
    made = subprocess.run(
        ["systemd-tmpfiles", "--create", f"--root={root}", str(TMPFILES)], capture_output=True, text=True, timeout=30
    )
    assert made.returncode == 0, made.stderr
    (line,) = [line for line in TMPFILES.read_text().splitlines() if line and not line.startswith("#")]
    return root / line.split()[1].lstrip("/")


def fill_template(**values: str) -> str:
    """deploy/nginx.conf.template filled by envsubst, as the template's header says: naming the
    variables, so that nginx's own `$host`, `$remote_addr`, … are left alone."""
    names = " ".join(f"${{{name}}}" for name in TEMPLATE_VARIABLES)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **values}
    filled = subprocess.run(
        ["envsubst", names], input=TEMPLATE.read_text(), env=env, capture_output=True, text=True, check=True, timeout=10
    )
    return filled.stdout


@dataclass
class Nginx:
    proc: Proc
    prefix: Path

    @property
    def url(self) -> str:
        return self.proc.url

    @property
    def address(self) -> tuple[str, int]:
        assert self.proc.port is not None
        return ("127.0.0.1", self.proc.port)

    def error_log(self) -> str:
        return self.proc.log()  # the template logs errors to stderr

    def access_log(self) -> str:
        return (self.prefix / "logs" / "access.log").read_text(errors="replace")


def upstream_of(proc: Proc) -> str:
    """How nginx's template names the server `proc`: its Unix socket, else its loopback port."""
    return f"unix:{proc.uds}" if proc.uds is not None else f"127.0.0.1:{proc.port}"


def start_nginx(
    procs: Procs,
    *,
    upstream: Proc,
    static_root: Path,
    prefix: Path,
    stream_upstream: Proc | None = None,
    timeout: float = 15,
) -> Nginx:
    """nginx on a free port in front of `upstream`, its streams sent to `stream_upstream` (the
    SSE edge; by default `upstream` too), serving `static_root` at /static/, with its pid, logs and
    temporary files in `prefix` (inside a `shared_folder`); ready once a request through it
    reaches the web process."""
    for sub in ("logs", "run", "tmp"):
        (prefix / sub).mkdir(parents=True, exist_ok=True)
    prefix.chmod(0o755)
    port = free_port()
    conf = prefix / "nginx.conf"
    conf.write_text(
        fill_template(
            LISTEN_PORT=str(port),
            UPSTREAM=upstream_of(upstream),
            STREAM_UPSTREAM=upstream_of(stream_upstream or upstream),
            STATIC_ROOT=str(static_root),
            NGINX_PREFIX=str(prefix),
        )
    )
    # -e stderr: errors from before the configuration is read go to the log too, not to the
    # compiled-in /var/log/nginx/error.log.
    args = [nginx_binary(), "-p", f"{prefix}/", "-c", str(conf), "-e", "stderr"]
    proc = procs.start("nginx", args, {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, port=port)
    wait_http_ok(proc, "/healthz/", timeout=timeout)
    return Nginx(proc=proc, prefix=prefix)
