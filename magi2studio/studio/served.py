"""Which files the studio serves and takes over HTTP: what the page shows and the reports it links; uploads only.

Gradio serves a file at ``/gradio_api/file=<path>`` only when the path, symlinks resolved, lies
in ``Blocks.allowed_paths``, its upload folder or its cache. The outputs root is not allowed: it
also holds the queue file (every job's prompt, id and owner), its locks and the hidden temp
folders of runs being written. What a component shows from a run folder (video, WAV, posters)
is handed over as a copy in Gradio's cache (:func:`cached`: Gradio copies it there anyway, and
checks the original against ``allowed_paths`` first). :class:`StudioBlocks` computes
``allowed_paths`` at each look-up: the assets passed to ``launch`` and the report files that
Reproduce and A/B link to (``<root>/reproduce/<stamp>/report.*``, ``<root>/ab/<stamp>/ab.*``;
not hidden, not symlinks). Nothing else under the root, and nothing outside it, is served by
any route or spelling of a path. A short list also keeps each file request cheap: Gradio
resolves every allowed path for every request (1,000 run folders listed cost 0.18 s a request, measured on
a loaded 2-core machine).

A file an event receives must be an upload (Gradio checks that before any handler runs, and a
server path such as ``{"path": "/etc/passwd"}`` came back as a traceback in the log and no
message); :meth:`StudioBlocks.validate_inputs` refuses it first, in one line naming the field.
"""

from __future__ import annotations

import inspect
import os
import threading
import time
from pathlib import Path
from typing import Any

import gradio as gr
from gradio.data_classes import FileData, ListFiles
from gradio.processing_utils import save_file_to_cache
from gradio.utils import get_upload_folder, is_in_or_equal
from gradio_client.utils import is_http_url_like

from ..errors import InputError
from .door import UnchangedOutputsBlocks

# The report files the Reproduce and A/B tabs link to, in <root>/<tab folder>/<stamp>/.
REPORTS = {"reproduce": ("report.html", "report.md", "report.json"), "ab": ("ab.md", "ab.json")}


def _visible_folders(folder: Path) -> list[Path]:
    """Folders directly in ``folder``: not hidden (temp files are), not symlinks."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    return [Path(entry.path) for entry in entries
            if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False)]


class ServedFiles:
    """The report files under the outputs root that the page links to (they may not exist yet)."""

    def __init__(self, outputs_root: Path) -> None:
        self.root = Path(outputs_root).resolve()

    def paths(self) -> list[str]:
        served = []
        for tab, names in REPORTS.items():
            for stamp in _visible_folders(self.root / tab):
                served += [str(stamp / name) for name in names if not (stamp / name).is_symlink()]
        return served


def cached(path: Path | str, outputs_root: Path) -> str | None:
    """A run folder's file as a copy in Gradio's cache, for a component to show (served from there); None for
    what is no regular file under the outputs root once symlinks are resolved (Gradio's own check refused it)."""
    resolved = Path(path).resolve()
    if not resolved.is_relative_to(Path(outputs_root).resolve()) or not resolved.is_file():
        return None
    return save_file_to_cache(resolved, get_upload_folder())


class StudioBlocks(UnchangedOutputsBlocks):
    """``gr.Blocks`` whose ``allowed_paths`` are the ones ``launch`` sets plus :class:`ServedFiles`, current
    (and whose untouched outputs cost nothing: door.py)."""

    served: ServedFiles | None = None

    @property
    def allowed_paths(self) -> list[str]:
        return [*self._launch_allowed, *(self.served.paths() if self.served is not None else [])]

    @allowed_paths.setter
    def allowed_paths(self, value: list[str]) -> None:
        self._launch_allowed = list(value)

    def validate_inputs(self, block_fn: Any, inputs: list[Any]) -> None:
        """Refuse a file input's object that names a server path (not an upload), by the endpoint's parameter name."""
        super().validate_inputs(block_fn, inputs)
        try:
            names = list(inspect.signature(block_fn.fn).parameters)
        except (TypeError, ValueError):
            names = []
        for index, (block, value) in enumerate(zip(block_fn.inputs, inputs)):
            model = getattr(block, "data_model", None)
            path = _server_path(value) if isinstance(model, type) and issubclass(model, (FileData, ListFiles)) else None
            if path is not None:
                field = names[index] if index < len(names) else getattr(block, "label", None) or "file"
                raise gr.Error(str(InputError(
                    field, f"{path[:80]!r} is not a file uploaded to this studio",
                    "upload it first (gradio_client: handle_file(path); HTTP: POST /gradio_api/upload) and send the "
                    "path that returns")), print_exception=False)


def _server_path(value: Any) -> str | None:
    """The path of a file object (or of one in a list) that does not lie in Gradio's upload folder, else None."""
    for item in value if isinstance(value, list) else [value]:
        path = item.get("path") if isinstance(item, dict) else None
        if isinstance(path, str) and not is_http_url_like(path) and not is_in_or_equal(path, get_upload_folder()):
            return path
    return None


def sweep_cache(folder: Path, max_age_s: float, now: float | None = None) -> int:
    """Delete the files in Gradio's cache ``folder`` made more than ``max_age_s`` ago, then the folders left empty;
    returns how many files went. Age is the file's ctime: Gradio copies with ``copy2``, which keeps the run's own
    (older) mtime. A file shown again later is copied back by :func:`cached` and Gradio, which check it exists."""
    now = time.time() if now is None else now
    removed = 0
    for parent, dirs, files in os.walk(folder, topdown=False):
        for name in files:
            path = os.path.join(parent, name)
            try:
                if now - os.lstat(path).st_ctime > max_age_s:
                    os.remove(path)
                    removed += 1
            except FileNotFoundError:
                continue
        if parent != str(folder):
            try:
                os.rmdir(parent)  # only when empty
            except OSError:
                pass
    return removed


class CacheSweeper:
    """Sweeps the studio's own Gradio cache every ``every_s`` (a daemon thread): without it the cache grew by each
    run shown for as long as the studio ran (376 MB after one audit). Gradio's ``delete_cache`` only knows the
    files its components track, not the copies :func:`cached` makes."""

    def __init__(self, folder: Path, max_age_s: float, every_s: float) -> None:
        self.folder, self.max_age_s, self.every_s = Path(folder), max_age_s, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gradio-cache-sweep", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            sweep_cache(self.folder, self.max_age_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
