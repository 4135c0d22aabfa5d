"""Files the app creates on its machine: the embedded database and its journal files,
the local secret key and the metrics files are readable by their owner only, whatever the umask;
the metrics directory and the secret key file are used only once they are this user's alone — a
directory or file another local user made first, or a link, is never used as it is.

Each proof starts a fresh process (tests/support/local_files.py) under a umask of 022."""

import json
import os
import stat
from pathlib import Path

import pytest

from tests.support.local_files import mode, run_python
from tests.support.procs import require_root

pytestmark = [pytest.mark.sqlite, pytest.mark.timeout(120)]

# Another local user, where the suite runs as root and can make files of theirs.
STRANGER = 65534


# --- the embedded database ------------------------------------------------------------------------

WRITE_AND_LOOK = """
import json, os, stat
from django.core.management import call_command
from django.db import connection
call_command("migrate", verbosity=0)
with connection.cursor() as cursor:  # a write, and the connection still open: the -wal and -shm are there
    cursor.execute("CREATE TABLE probe (x integer)")
    name = connection.settings_dict["NAME"]
    print(json.dumps({s: stat.S_IMODE(os.stat(name + s).st_mode) for s in ("", "-wal", "-shm")}))
"""


def test_the_embedded_database_and_its_journal_files_are_readable_by_their_owner_only(tmp_path: Path) -> None:
    database = tmp_path / "runledger.sqlite3"
    done = run_python(WRITE_AND_LOOK, DATABASE_URL=f"sqlite:///{database}", DJANGO_SECRET_KEY="k" * 50)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"": 0o600, "-wal": 0o600, "-shm": 0o600}


def test_an_existing_database_file_is_neither_replaced_nor_followed_through_a_link(tmp_path: Path) -> None:
    # Settings made elsewhere, e.g. an operator's 0640 for a backup group: not the app's to change.
    mine = tmp_path / "kept.sqlite3"
    mine.touch(mode=0o640)
    target = tmp_path / "target"
    (tmp_path / "linked.sqlite3").symlink_to(target)
    for name in ("kept.sqlite3", "linked.sqlite3"):
        done = run_python("", DATABASE_URL=f"sqlite:///{tmp_path / name}", DJANGO_SECRET_KEY="k" * 50)
        assert done.returncode == 0, done.stderr
    assert mode(mine) == 0o640 and not target.exists()


# --- the local secret key -------------------------------------------------------------------------

PRINT_KEY = "from django.conf import settings; print(settings.SECRET_KEY)"


def key_process(key_file: Path) -> "tuple[int, str]":
    done = run_python(
        PRINT_KEY, DATABASE_URL=f"sqlite:///{key_file.parent / 'db.sqlite3'}", RUNLEDGER_LOCAL_SECRET_FILE=str(key_file)
    )
    return done.returncode, done.stdout.strip() if done.returncode == 0 else done.stderr


def test_the_local_secret_key_is_made_owner_only_and_read_only_while_it_stays_so(tmp_path: Path) -> None:
    key_file = tmp_path / "secret-key"
    status, key = key_process(key_file)
    assert status == 0 and mode(key_file) == 0o600 and len(key) >= 50
    key_file.chmod(0o644)
    status, refused = key_process(key_file)
    assert status != 0 and "no other user may read or write, not mode 0644" in refused and "chmod 600" in refused
    key_file.chmod(0o600)
    assert key_process(key_file) == (0, key)


def test_a_secret_key_file_that_is_a_link_or_a_fifo_is_refused_not_followed(tmp_path: Path) -> None:
    planted = tmp_path / "planted"
    planted.write_text("k" * 50)
    planted.chmod(0o600)
    (tmp_path / "linked").symlink_to(planted)
    status, refused = key_process(tmp_path / "linked")
    assert status != 0 and "it is a symbolic link" in refused
    os.mkfifo(tmp_path / "fifo", 0o600)
    status, refused = key_process(tmp_path / "fifo")  # refused at once: never held at its open
    assert status != 0 and "must be a file of this user's" in refused


def test_a_secret_key_file_of_another_user_is_refused(tmp_path: Path) -> None:
    require_root("to make a file of another user's")
    planted = tmp_path / "secret-key"
    planted.write_text("k" * 50)
    planted.chmod(0o600)
    os.chown(planted, STRANGER, STRANGER)
    status, refused = key_process(planted)
    assert status != 0 and f"of uid {STRANGER}" in refused


# --- the metrics directory and its files ----------------------------------------------------------

COUNT_AND_LOOK = """
import json, os, stat
from runs.metrics import series, store
series.made().EVENTS_APPENDED.inc()
where = store.directory()
print(json.dumps({
    "directory": where,
    "mode": stat.S_IMODE(os.lstat(where).st_mode),
    "files": {name: stat.S_IMODE(os.lstat(os.path.join(where, name)).st_mode) for name in os.listdir(where)},
}))
"""


def counting_process(tmp_path: Path, **env: str) -> "tuple[int, dict[str, object] | str]":
    """A process that counts one event, on a database of its own, with `tmp_path` as the system's
    temporary folder; what it counted in, or why it refused to start."""
    done = run_python(
        COUNT_AND_LOOK,
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        DJANGO_SECRET_KEY="k" * 50,
        TMPDIR=str(tmp_path),
        **env,
    )
    if done.returncode != 0:
        return done.returncode, done.stderr
    return 0, {**json.loads(done.stdout.splitlines()[-1]), "log": done.stderr}


def default_directory(tmp_path: Path) -> Path:
    # The settings alone: setting up the apps would make the directory.
    done = run_python(
        "from runs.conf import conf; print(conf.METRICS_DIR)",
        setup=False,
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        DJANGO_SECRET_KEY="k" * 50,
        TMPDIR=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


def test_the_metrics_directory_and_its_files_are_made_owner_only(tmp_path: Path) -> None:
    status, found = counting_process(tmp_path)
    assert status == 0 and isinstance(found, dict), found
    assert found["directory"] == str(default_directory(tmp_path))
    assert found["mode"] == 0o700
    files = found["files"]
    assert isinstance(files, dict) and files and set(files.values()) == {0o600}, files


@pytest.mark.parametrize("squat", ["open", "link"])
def test_a_default_metrics_directory_made_first_by_someone_else_is_left_alone(tmp_path: Path, squat: str) -> None:
    """The default name is predictable and the folder shared: whoever made it first, as a directory
    others may reach or as a link to one of theirs, gets nothing written there. The process counts
    in a private directory of its own and says so."""
    predicted = default_directory(tmp_path)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o777)
    theirs.chmod(0o777)
    if squat == "open":
        predicted.mkdir()
        predicted.chmod(0o777)
    else:
        predicted.symlink_to(theirs)
    status, found = counting_process(tmp_path)
    assert status == 0 and isinstance(found, dict), found
    own = Path(str(found["directory"]))
    assert own != predicted and own.parent == tmp_path and found["mode"] == 0o700
    assert "is not this user's private directory" in str(found["log"]) and str(own) in str(found["log"])
    assert list(theirs.iterdir()) == [] and (squat == "link" or list(predicted.iterdir()) == [])


def test_a_default_metrics_directory_of_another_user_is_left_alone(tmp_path: Path) -> None:
    require_root("to make a file of another user's")
    predicted = default_directory(tmp_path)
    predicted.mkdir(mode=0o700)
    os.chown(predicted, STRANGER, STRANGER)
    status, found = counting_process(tmp_path)
    assert status == 0 and isinstance(found, dict), found
    assert found["directory"] != str(predicted) and f"belongs to uid {STRANGER}" in str(found["log"])
    assert list(predicted.iterdir()) == []


def test_a_chosen_metrics_directory_others_may_reach_stops_the_process(tmp_path: Path) -> None:
    chosen = tmp_path / "chosen" / "metrics"
    chosen.mkdir(parents=True)
    chosen.chmod(0o755)
    status, refused = counting_process(tmp_path, RUNLEDGER_METRICS_DIR=str(chosen))
    assert status != 0 and f"RUNLEDGER_METRICS_DIR {chosen} is not this user's private directory" in str(refused)
    assert "its mode is 0755" in str(refused) and list(chosen.iterdir()) == []
    chosen.chmod(0o700)
    status, found = counting_process(tmp_path, RUNLEDGER_METRICS_DIR=str(chosen))
    assert status == 0 and isinstance(found, dict) and found["directory"] == str(chosen), found
    assert stat.S_IMODE(chosen.stat().st_mode) == 0o700
