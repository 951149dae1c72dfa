"""Writing a file whole or not at all: beside the target, then a rename."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..errors import os_error_naming


def write_atomic(path: Path, text: str) -> None:
    """Write beside the target, then rename: a reader never sees half a file."""

    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except OSError as err:  # a refused write (full disk, ulimit -f) names the file it was for
        Path(temp).unlink(missing_ok=True)
        raise os_error_naming(err, str(path)) from err
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
