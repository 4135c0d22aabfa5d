"""Where a client finds its server and token, as users of other SDKs expect: the arguments given,
else the environment (`RUNLEDGER_URL`, `RUNLEDGER_TOKEN` or `RUNLEDGER_TOKEN_FILE`), else a profile
of the per-user config file (`$XDG_CONFIG_HOME/runledger/config.toml`, by default
`~/.config/runledger/config.toml`), chosen by `profile=`/`--profile`, `RUNLEDGER_PROFILE`, or
`default`:

```toml
[profiles.default]
url = "http://127.0.0.1:8000"
token_file = "~/.config/runledger/token"   # or token = "..."

[profiles.staging]
url = "https://runledger.staging.example"
token_file = "~/.config/runledger/staging-token"
```

A token given in a file (`token_file`, `RUNLEDGER_TOKEN_FILE`) keeps it out of `ps` and shell
history; the file should be readable by you alone (`warnings` says when it is not).
"""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runledger_client.errors import ConfigError

DEFAULT_PROFILE = "default"


def config_path(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(base) / "runledger" / "config.toml"


@dataclass
class Settings:
    """A resolved configuration: the server, the token (None: nowhere to be found), and what to
    warn the user about."""

    url: str | None
    token: str | None
    profile: str | None = None
    warnings: list[str] = field(default_factory=list)


def read_token_file(path: str, warnings: list[str]) -> str:
    path = os.path.expanduser(path)
    try:
        with open(path, encoding="utf-8") as file:
            if os.fstat(file.fileno()).st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                warnings.append(f"{path} is open to other users: chmod 600 it")
            token = file.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the token file {path}: {exc}") from None
    if not token:
        raise ConfigError(f"the token file {path} is empty")
    return token


def _profile(env: Mapping[str, str], name: str | None) -> tuple[str | None, dict[str, Any]]:
    """The profile's table (empty when there is no file, or the default profile is not in it); a
    profile asked for by name must exist."""
    path = config_path(env)
    chosen = name or env.get("RUNLEDGER_PROFILE") or None
    try:
        with open(path, "rb") as file:
            document = tomllib.load(file)
    except FileNotFoundError:
        if chosen is not None:
            raise ConfigError(f"no profile {chosen!r}: there is no config file {path}") from None
        return None, {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc}") from None
    profiles = document.get("profiles")
    profiles = profiles if isinstance(profiles, dict) else {}
    table = profiles.get(chosen or DEFAULT_PROFILE)
    if table is None:
        if chosen is not None:
            known = ", ".join(sorted(profiles)) or "none"
            raise ConfigError(f"no profile {chosen!r} in {path} (its profiles: {known})")
        return None, {}
    if not isinstance(table, dict):
        raise ConfigError(f"[profiles.{chosen or DEFAULT_PROFILE}] in {path} is not a table")
    return chosen or DEFAULT_PROFILE, table


def resolve(
    *,
    url: str | None = None,
    token: str | None = None,
    token_file: str | None = None,
    profile: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """The arguments win over the environment, the environment over the config file; the file is
    read only for what the arguments and the environment leave open, or for a profile named by
    argument (which must exist). So with a URL and a token given, a config file that cannot be
    read, or names a missing `RUNLEDGER_PROFILE`, stops nothing: it is not needed."""
    env = os.environ if env is None else env
    warnings: list[str] = []
    url = url or env.get("RUNLEDGER_URL") or None
    if token is None and token_file:
        token = read_token_file(token_file, warnings)
    if token is None and env.get("RUNLEDGER_TOKEN"):
        token = env["RUNLEDGER_TOKEN"]
    if token is None and env.get("RUNLEDGER_TOKEN_FILE"):
        token = read_token_file(env["RUNLEDGER_TOKEN_FILE"], warnings)
    if url and token and profile is None:
        return Settings(url=url, token=token, warnings=warnings)
    name, table = _profile(env, profile)
    if url is None and table.get("url"):
        url = str(table["url"])
    if token is None and table.get("token"):
        token = str(table["token"])
    if token is None and table.get("token_file"):
        token = read_token_file(str(table["token_file"]), warnings)
    return Settings(url=url, token=token, profile=name, warnings=warnings)


def settings_for(url: str | None, token: str | None, profile: str | None) -> Settings:
    """`Client()`'s configuration: both the URL and the token must be found somewhere."""
    found = resolve(url=url, token=token, profile=profile)
    if not found.url or not found.token:
        missing = " and ".join(name for name, value in (("a URL", found.url), ("a token", found.token)) if not value)
        raise ConfigError(
            f"missing {missing}: pass url= and token=, set RUNLEDGER_URL and RUNLEDGER_TOKEN (or RUNLEDGER_TOKEN_FILE), "
            f"or write a profile in {config_path(os.environ)}"
        )
    return found
