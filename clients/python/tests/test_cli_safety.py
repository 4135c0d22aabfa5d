"""What the CLI does for the person at the terminal: agents' text without control sequences, the
token from a file (never only from a flag `ps` shows), a warning before plain HTTP leaves the machine."""

import json
import os
import stat
from pathlib import Path

import pytest

from runledger_client.cli import connection, parser, plain_http_warning, printable, printable_json

ESC = "\x1b"


def test_printable_keeps_text_newlines_and_tabs_and_drops_every_control_sequence() -> None:
    hostile = (
        f"red {ESC}[31;1mbold{ESC}[0m\n"  # colours (CSI)
        f"{ESC}]0;owned{ESC}\\title {ESC}]8;;https://evil.example/\x07link{ESC}]8;;\x07\n"  # OSC, both ends
        f"{ESC}P+q544e{ESC}\\dcs {ESC}(0line{ESC}(B {ESC}c{ESC}7{ESC}8\n"  # DCS, charset, reset, save
        "over\rwrite back\x08space bell\x07 nul\x00 del\x7f c1\x9b2Jcsi \x9d0;t\x9c\t tab"
    )
    assert printable(hostile) == ("red bold\ntitle link\ndcs line \noverwrite backspace bell nul del c12Jcsi 0;t\t tab")
    assert printable("plain: é ü 中文 🙂\n\tindented") == "plain: é ü 中文 🙂\n\tindented"
    # A sequence cut between two deltas leaves no control behind either.
    assert printable(f"cut {ESC}[") + printable("31mhere") == "cut 31mhere"
    assert printable(f"{ESC}]0;never ended") == ""


def test_printable_json_escapes_del_and_c1_and_keeps_the_value() -> None:
    raw = json.dumps({"text": "a\x9b31mb\x7fc\u00e9", "n": 1}, ensure_ascii=False)
    shown = printable_json(raw)
    assert "\x9b" not in shown and "\x7f" not in shown and "\\u009b" in shown and "é" in shown
    assert json.loads(shown) == json.loads(raw)


@pytest.mark.parametrize(
    ("url", "warned"),
    [
        ("http://runledger.example.com", True),
        ("http://192.0.2.7:8000/", True),
        ("http://[2001:db8::1]:8000", True),
        ("https://runledger.example.com", False),
        ("http://localhost:8000", False),
        ("http://app.localhost", False),
        ("http://127.0.0.1:8000", False),
        ("http://127.1.2.3", False),
        ("http://[::1]:8000", False),
        ("http://[::ffff:127.0.0.1]:8000", False),
    ],
)
def test_plain_http_to_another_machine_is_warned_about(url: str, warned: bool) -> None:
    warning = plain_http_warning(url)
    assert (warning is not None) == warned
    assert warning is None or (url in warning and "unencrypted" in warning)


def token_of(*argv: str) -> str | None:
    return connection(parser().parse_args([*argv, "--url", "http://127.0.0.1:9", "list"]))[1]


@pytest.fixture(autouse=True)
def no_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("file-token\n")
    path.chmod(0o600)
    return path


def test_the_token_comes_from_the_flag_the_file_then_the_environment(
    token_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("RUNLEDGER_TOKEN", "RUNLEDGER_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    assert token_of("--token-file", str(token_file)) == "file-token"
    assert token_of("--token", "flag-token", "--token-file", str(token_file)) == "flag-token"
    monkeypatch.setenv("RUNLEDGER_TOKEN_FILE", str(token_file))
    assert token_of() == "file-token"
    monkeypatch.setenv("RUNLEDGER_TOKEN", "env-token")
    assert token_of() == "env-token"
    assert token_of("--token-file", str(token_file)) == "file-token"  # a flag before the environment
    assert capsys.readouterr().err == ""  # a 0600 file: no warning


def test_a_token_file_others_may_read_is_used_with_a_warning_and_an_unusable_one_is_refused(
    token_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token_file.chmod(0o644)
    assert token_of("--token-file", str(token_file)) == "file-token"
    assert f"{token_file} is open to other users: chmod 600 it" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.write_text(" \n")
    for path, message in [(empty, "is empty"), (tmp_path / "missing", "cannot read the token file")]:
        with pytest.raises(Exception, match=message):
            token_of("--token-file", str(path))
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o644  # a warning; the file is the user's to change
