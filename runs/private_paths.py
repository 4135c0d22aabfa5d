"""Directories of this process's user alone, on a machine other users share.

A directory with a name anyone can predict, in a folder where anyone may make one first (the
system's temporary folder), may have been made by another user — as a directory they can enter, or
as a link to one of theirs — to read what is written there, or to fill it with links to files of
ours. So such a directory is used only once it is known to be private: a real directory, not a
link (lstat, never followed), owned by this user, with no access for group or others.
"""

import contextlib
import os
import stat


def directory_problem(path: str) -> str | None:
    """What makes `path` not a private directory of this user's; None when it is one."""
    found = os.lstat(path)
    if stat.S_ISLNK(found.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(found.st_mode):
        return "it is not a directory"
    if found.st_uid != os.geteuid():
        return f"it belongs to uid {found.st_uid}, not to this user (uid {os.geteuid()})"
    if found.st_mode & 0o077:
        return f"its mode is {stat.S_IMODE(found.st_mode):04o}: other users may reach it (chmod 700 it)"
    return None


def private_directory(path: str) -> str | None:
    """Make `path` (mode 0700, its parents as need be) unless it exists, then check it as
    `directory_problem` does."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    return directory_problem(path)
