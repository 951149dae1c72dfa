"""The one error type for bad input: it names the field and the fix, never a traceback."""

from __future__ import annotations


def one_line(text: str) -> str:
    """``text`` with line breaks and other unprintable characters escaped (a user's path may hold them)."""

    text = str(text)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


class InputError(ValueError):
    """A request, layout or file the user gave is unusable.

    ``str(err)`` is one line: ``<field>: <problem>. Fix: <fix>``. The CLI prints it and
    exits 2; the studio shows it next to the field; nothing is written to disk.
    """

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field = one_line(field)
        self.problem = one_line(problem)
        self.fix = one_line(fix)
        field, problem, fix = self.field, self.problem, self.fix
        super().__init__(f"{field}: {problem}. Fix: {fix}")


class EngineError(RuntimeError):
    """The engine failed while running a valid request (CLI exit 1)."""


class Cancelled(RuntimeError):
    """The user stopped the run: at a step boundary, or ``where`` else (a stage boundary, the engine's start,
    the run folder's writing); the job's message says where, so a cancel is never mistaken for a step's."""

    def __init__(self, message: str = "", *, where: str = "at a step boundary") -> None:
        super().__init__(message)
        self.where = where


class Terminated(BaseException):
    """SIGTERM arrived: unwinds like KeyboardInterrupt, so temp folders are removed on the way out."""


_OS_FIXES = {
    "ENOSPC": "free space on that disk, or write elsewhere (--out)",
    "EDQUOT": "free space within your quota, or write elsewhere (--out)",
    "EACCES": "make it writable for this user, or choose another folder (--out)",
    "EPERM": "make it writable for this user, or choose another folder (--out)",
    "EROFS": "the filesystem is read-only: choose another folder (--out)",
    "EMFILE": "raise the open-file limit (ulimit -n), then run again",
    "ENOMEM": "free memory, then run again",
}


def os_error_naming(err: OSError, filename: str) -> OSError:
    """``err`` naming ``filename``: a new OSError of the same errno (and subclass), since some (PyAV's) have a
    read-only file name; raise it ``from err``."""

    return OSError(err.errno, err.strerror or str(err), filename)


def _file_size_fix() -> str:
    """The fix for EFBIG: this process's file-size limit (``ulimit -f``) if it has one, else the filesystem's."""

    import resource

    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit == resource.RLIM_INFINITY:
        return "this filesystem takes no file that large: write to another (--out)"
    return (f"this process may write files of at most {limit // 1024} KiB (ulimit -f): raise it "
            "(ulimit -f unlimited), then run again")


def describe_os_error(err: OSError) -> str:
    """``<what>: <why>. Fix: <fix>`` for an operating-system refusal (disk full, permission, too large)."""

    import errno as errno_names

    name = errno_names.errorcode.get(err.errno or 0, "")
    what = one_line(err.filename) if err.filename is not None else "a file operation"
    why = err.strerror or str(err) or type(err).__name__
    fix = _file_size_fix() if name == "EFBIG" else _OS_FIXES.get(
        name, "check the path, the disk and its permissions, then run again")
    return f"{what}: {why}{f' ({name})' if name else ''}. Fix: {fix}"
