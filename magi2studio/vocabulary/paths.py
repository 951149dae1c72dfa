"""User-named files: one containment rule and one way to read them, with the project's refusals.

The rule for a path written inside a file (a sample set's entries, a request YAML's
``prompt_file``): resolve it (symlinks included), then require the result inside an explicit
root (the naming file's folder, or a folder the user names with a flag). Never a guessed
ancestor: a set at ``/tmp/s.json`` has root ``/tmp``, not ``/``.

Reading refuses, by name, what is not a regular file (a folder, a fifo, a device such as
``/dev/zero``), what cannot be read, what is too large and what is not UTF-8, before opening
anything that could block.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ..errors import InputError, one_line


def contained(written: str, root: Path, field: str, *, base: Path | None = None) -> Path:
    """``written`` resolved against ``base`` (default ``root``); refuse it if it leaves ``root``."""

    if not isinstance(written, str) or not written.strip() or "\x00" in written:
        raise InputError(field, "must be a non-empty path string", "write a path relative to the file's folder")
    if Path(written).is_absolute():
        raise InputError(field, f"{written} is an absolute path", f"write it relative to {root}")
    root = Path(root).resolve()
    resolved = ((base or root) / written).resolve()
    if not resolved.is_relative_to(root):
        raise InputError(field, f"{written} resolves outside the root {root}",
                         "keep the files it names inside that folder, or name a wider root with --root")
    return resolved


def inside(path: str | Path, root: Path, field: str, fix: str) -> Path:
    """``path`` resolved; refuse it unless it lies inside ``root`` (for absolute paths a client sends)."""

    resolved = Path(path).resolve()
    if not resolved.is_relative_to(Path(root).resolve()):
        raise InputError(field, f"{path} is not inside {root}", fix)
    return resolved


def regular_file(path: str | Path, field: str, what: str) -> os.stat_result:
    """Stat ``path`` and refuse anything but a readable regular file, naming the reason."""

    if "\x00" in str(path):  # os.stat raises ValueError, not OSError, for it
        raise InputError(field, f"{one_line(str(path))} holds a NUL character", f"give the path of {what}")
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise InputError(field, f"{path} does not exist", f"give the path of {what}") from None
    except PermissionError:
        raise InputError(field, f"{path} cannot be read (permission denied)",
                         "make it readable, or copy it somewhere you can read") from None
    except OSError as err:
        raise InputError(field, f"{path} cannot be opened ({err.strerror or err})",
                         f"give the path of {what}") from None
    if stat.S_ISDIR(info.st_mode):
        raise InputError(field, f"{path} is a folder, not a file", f"give the path of {what} inside it")
    if not stat.S_ISREG(info.st_mode):
        kind = ("a fifo" if stat.S_ISFIFO(info.st_mode) else "a device" if stat.S_ISCHR(info.st_mode) or
                stat.S_ISBLK(info.st_mode) else "a socket" if stat.S_ISSOCK(info.st_mode) else "not a regular file")
        raise InputError(field, f"{path} is {kind}, not a regular file", f"give the path of {what}")
    if not os.access(path, os.R_OK):
        raise InputError(field, f"{path} cannot be read (permission denied)",
                         "make it readable, or copy it somewhere you can read")
    return info


def read_text(path: str | Path, field: str, what: str, max_bytes: int, *, noun: str = "file") -> str:
    """A regular UTF-8 file of at most ``max_bytes``, read whole; every failure an InputError."""

    info = regular_file(path, field, what)
    if info.st_size > max_bytes:
        raise InputError(field, f"{path} is {info.st_size} bytes", f"use a {noun} under {max_bytes // 1024} KiB")
    try:
        with open(path, "rb") as file:
            data = file.read(max_bytes + 1)
    except OSError as err:
        reason = "permission denied" if err.errno in (errno.EACCES, errno.EPERM) else (err.strerror or str(err))
        raise InputError(field, f"{path} cannot be read ({reason})", f"give the path of {what}") from None
    if len(data) > max_bytes:
        raise InputError(field, f"{path} is over {max_bytes} bytes", f"use a {noun} under {max_bytes // 1024} KiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(field, f"{path} is not UTF-8 text", "save it as UTF-8") from None
