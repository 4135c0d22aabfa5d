"""The kinds of setting the registry declares (runs/conf.py), and the registry's reading and checking.

A kind says what a value must be — in the words of the message that refuses one — how an
environment variable's text stands for one, and what a read of it gives. A `Registry` reads its
declared settings from Django's settings, or, given an environment, from the variables of the same
names; `problems` is the one validation of them all.
"""

import ipaddress
import math
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Generic, Self, TypeVar, overload
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

PREFIX = "RUNLEDGER_"
# The processes that read a setting, for the reference: the web processes, `runworker`, `runedge`.
WEB, WORKER, EDGE = "web", "worker", "edge"
SERVING = (WEB, WORKER)

T = TypeVar("T")
_UNSET: Any = object()


class Setting(Generic[T]):
    """One setting. `must` says what it must be, in the words of the message that refuses it."""

    must = "text"

    def __init__(
        self, default: Any, doc: str, processes: tuple[str, ...], *, shown: str = "", secret: bool = False
    ) -> None:
        # A callable default is worked out when it is read: it depends on other settings.
        self.default, self.doc, self.processes, self.shown, self.secret = default, doc, processes, shown, secret
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = getattr(owner, "prefix", PREFIX) + name

    @overload
    def __get__(self, registry: None, owner: type | None = None) -> Self: ...
    @overload
    def __get__(self, registry: "Registry", owner: type | None = None) -> T: ...
    def __get__(self, registry: "Registry | None", owner: type | None = None) -> "T | Self":
        return self if registry is None else registry.read(self)

    def parse(self, text: str) -> Any:
        """What an environment variable's text stands for; the text itself when it stands for nothing."""
        return text

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str)

    def convert(self, value: Any) -> T:
        return value

    def default_value(self) -> T:
        return self.default() if callable(self.default) else self.default

    def refusal(self, given: Any) -> str:
        # A secret is never repeated, not even in the message that refuses it.
        return f"{self.name} must be {self.must}" + ("" if self.secret else f", not {given!r}")

    def default_text(self) -> str:
        value = self.default
        if self.shown or callable(value):
            return self.shown
        if isinstance(value, bool):
            return "1" if value else "0"
        if isinstance(value, int):
            return f"{value:,}"
        if isinstance(value, float):
            return f"{value:g}"
        if isinstance(value, list):
            value = ",".join(value)
        return f"`{value}`" if value else "empty"


def _number(text: str, kind: Callable[[str], Any]) -> Any:
    try:
        return kind(text)
    except ValueError:
        return text  # refused with the rest: the message shows what was given


class _WholeNumber(Setting[T]):
    def __init__(
        self, default: int, doc: str, processes: tuple[str, ...], *, minimum: int = 1, unit: str = "", zero: str = ""
    ) -> None:
        super().__init__(default, doc, processes)
        self.minimum = minimum
        self.must = f"a whole number{' of ' + unit if unit else ''} ≥ {minimum}" + (f" (0 = {zero})" if zero else "")

    def parse(self, text: str) -> Any:
        return _number(text, int)

    def accepts(self, value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= self.minimum


class Whole(_WholeNumber[int]):
    def convert(self, value: Any) -> int:
        return int(value)


class Limit(_WholeNumber[int | None]):
    """A whole number ≥ 0 where 0 means none: read as None."""

    def __init__(
        self, default: int, doc: str, processes: tuple[str, ...], *, unit: str = "", zero: str = "unlimited"
    ) -> None:
        super().__init__(default, doc, processes, minimum=0, unit=unit, zero=zero)

    def convert(self, value: Any) -> int | None:
        return int(value) or None


class Seconds(Setting[float]):
    """A number of seconds above 0 — or, with a meaning for `zero`, at least 0."""

    def __init__(self, default: float, doc: str, processes: tuple[str, ...], *, zero: str = "") -> None:
        super().__init__(default, doc, processes)
        self.zero = zero
        self.must = f"a number of seconds ≥ 0 (0 = {zero})" if zero else "a number of seconds above 0"

    def parse(self, text: str) -> Any:
        return _number(text, float)

    def accepts(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return False
        return value >= 0 if self.zero else value > 0

    def convert(self, value: Any) -> float:
        return float(value)


class Flag(Setting[bool]):
    must = "on or off: 1 or 0, true or false, yes or no"
    WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}

    def parse(self, text: str) -> Any:
        # Empty is off, as an unset switch in a shell script is.
        return self.WORDS.get(text.strip().lower(), text) if text.strip() else False

    def accepts(self, value: Any) -> bool:
        return isinstance(value, bool) or (isinstance(value, int) and value in (0, 1))

    def convert(self, value: Any) -> bool:
        return bool(value)


class Text(Setting[str]):
    def __init__(
        self,
        default: Any,
        doc: str,
        processes: tuple[str, ...],
        *,
        must: str = "",
        pattern: str = "",
        shown: str = "",
        secret: bool = False,
    ) -> None:
        super().__init__(default, doc, processes, shown=shown, secret=secret)
        self.must, self.pattern = must or self.must, pattern

    def parse(self, text: str) -> Any:
        # Empty is the default, so an environment file may list a variable it leaves unset.
        return text or _UNSET

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str) and (not self.pattern or re.fullmatch(self.pattern, value) is not None)


class Url(Text):
    must = "an http:// or https:// URL"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str) and urlsplit(value).scheme in ("http", "https") and bool(urlsplit(value).netloc)


class Names(Setting[list[str]]):
    """A list of names, each of which `item` accepts; comma-separated in the environment."""

    def __init__(
        self, default: list[str], doc: str, processes: tuple[str, ...], *, must: str, item: Callable[[str], bool]
    ) -> None:
        super().__init__(default, doc, processes)
        self.must, self.item = must, item

    def parse(self, text: str) -> Any:
        return [name.strip() for name in text.split(",") if name.strip()]

    def accepts(self, value: Any) -> bool:
        return isinstance(value, list | tuple) and all(isinstance(name, str) and self.item(name) for name in value)

    def convert(self, value: Any) -> list[str]:
        return list(value)

    def default_value(self) -> list[str]:
        return list(self.default)  # a copy: a caller may change what it was given


def pattern(regex: str) -> Callable[[str], bool]:
    return lambda name: re.fullmatch(regex, name) is not None


# What reads from Django's settings found, kept until a setting changes (override_settings and the
# test settings fixture say so): a read of an unset one would otherwise raise and catch an
# AttributeError every time, a few microseconds per read on every request (docs/design/api.md#hot-reads).
_kept: dict[Setting[Any], Any] = {}


def _forget(**kwargs: Any) -> None:
    _kept.clear()  # any setting: a callable default may depend on another


setting_changed.connect(_forget, dispatch_uid="runledger-settings-kept")


class Registry:
    """Settings declared as class attributes, read from Django's settings or, given `environ`,
    from the environment variables of the same names (`prefix` and the attribute's)."""

    prefix: ClassVar[str] = PREFIX

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = environ

    @classmethod
    def declared(cls) -> list[Setting[Any]]:
        found: dict[str, Setting[Any]] = {}
        for klass in reversed(cls.__mro__):
            found.update({s.name: s for s in vars(klass).values() if isinstance(s, Setting)})
        return list(found.values())

    def _given(self, setting: Setting[Any]) -> tuple[Any, Any]:
        """What was set (_UNSET if nothing), and how to show it in a refusal."""
        if self._environ is None:
            value = getattr(settings, setting.name, _UNSET)
            return value, value
        text = self._environ.get(setting.name)
        return (_UNSET, None) if text is None else (setting.parse(text), text)

    def read(self, setting: Setting[T]) -> T:
        if self._environ is None and (kept := _kept.get(setting, _UNSET)) is not _UNSET:
            return kept
        value, _ = self._given(setting)
        read: T = setting.convert(setting.default_value() if value is _UNSET else value)
        if self._environ is None and not isinstance(read, list | dict | set):
            _kept[setting] = read  # a mutable value is made anew each read: its reader may change it
        return read

    def problem(self, setting: Setting[Any]) -> str | None:
        """Why the value set for `setting` is refused, or None."""
        value, shown = self._given(setting)
        return None if value is _UNSET or setting.accepts(value) else setting.refusal(shown)

    def value_problems(self) -> list[str]:
        return [problem for setting in self.declared() if (problem := self.problem(setting)) is not None]

    def rule_problems(self) -> list[str]:
        """What settings that are each right cannot do together."""
        return []

    def problems(self) -> list[str]:
        # The rules do arithmetic on the values: only once each is what it must be.
        return self.value_problems() or self.rule_problems()

    def require(self) -> None:
        """Refuse to go on with settings that cannot work, naming each problem."""
        problems = self.problems()
        if problems:
            raise ImproperlyConfigured("; ".join(problems))

    def given(self) -> dict[str, Any]:
        """The settings the environment sets, as a settings module's names and values."""
        problems = self.value_problems()
        if problems:
            raise ImproperlyConfigured("; ".join(problems))
        values = {setting.name: self._given(setting)[0] for setting in self.declared()}
        return {name: value for name, value in values.items() if value is not _UNSET}

    def ignored(self, environ: Mapping[str, str]) -> list[str]:
        """The declared settings that `environ` sets to another value than these settings give (or
        to one no setting takes): what a project whose settings module never reads its environment
        leaves unused. A setting whose own value is refused is left to `problems`."""
        given = type(self)(environ)
        found = []
        for setting in self.declared():
            wanted, _ = given._given(setting)
            if wanted is _UNSET or self.problem(setting) is not None:
                continue  # not set, or empty (the default, whatever the settings hold)
            if not setting.accepts(wanted) or setting.convert(wanted) != self.read(setting):
                found.append(setting.name)
        return found

    @classmethod
    def reference(cls) -> str:
        """The declared settings as a Markdown table, for the docs."""
        rows = ["| Setting | Value | Default | What it does | Processes |", "|---|---|---|---|---|"]
        for s in cls.declared():
            rows.append(f"| `{s.name}` | {s.must} | {s.default_text()} | {s.doc} | {', '.join(s.processes)} |")
        return "\n".join(rows) + "\n"


# What fits in a Unix socket's address (sun_path), its final NUL aside.
SOCKET_PATH_MAX = 107


def socket_path(url: str) -> Path:
    """The file of an `ipc://` control URL (ValueError for anything else)."""
    if not url.startswith("ipc:///"):
        raise ValueError(f"not an ipc:// URL with an absolute path: {url!r}")
    path = Path(url.removeprefix("ipc://"))
    if len(os.fsencode(path)) > SOCKET_PATH_MAX:
        raise ValueError(f"{path} is longer than a Unix socket's address ({SOCKET_PATH_MAX} bytes)")
    return path


def is_socket_url(url: str) -> bool:
    try:
        socket_path(url)
    except ValueError:
        return False
    return True


def is_network(text: str) -> bool:
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return True
