"""Which files the studio serves and takes over HTTP: complete run folders and the reports it links; uploads only.

Gradio serves a file at ``/gradio_api/file=<path>`` (and copies one into its cache when a
component shows it) only when the path, symlinks resolved, lies in ``Blocks.allowed_paths``,
its upload folder or its cache. The outputs root itself is not allowed: it also holds the queue
file (every job's prompt, id and owner), its locks and the hidden temp folders of runs being
written. :class:`StudioBlocks` computes ``allowed_paths`` at each look-up instead: the assets
passed to ``launch``, every complete run folder directly under the root (not hidden, not a
symlink; its six files are what History and the run zip show anyone who opens the page), and
the report files that Reproduce and A/B link to. Anything else under the root, and anything a
symlink points to outside it, is refused by every route and spelling of a path.

A file an event receives must be an upload (Gradio checks that before any handler runs, and a
server path such as ``{"path": "/etc/passwd"}`` came back as a traceback in the log and no
message); :meth:`StudioBlocks.validate_inputs` refuses it first, in one line naming the field.
"""

from __future__ import annotations

import inspect
import os
import threading
from pathlib import Path
from typing import Any

import gradio as gr
from gradio.data_classes import FileData, ListFiles
from gradio.utils import get_upload_folder, is_in_or_equal
from gradio_client.utils import is_http_url_like

from ..errors import InputError
from ..runs import is_complete

# The report files the Reproduce and A/B tabs link to, in <root>/<tab folder>/<stamp>/.
REPORTS = {"reproduce": ("report.html", "report.md", "report.json"), "ab": ("ab.md", "ab.json")}


def _visible_folders(folder: Path) -> list[Path]:
    """Folders directly in ``folder``: not hidden (temp folders are), not symlinks."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    return [Path(entry.path) for entry in entries
            if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False)]


class ServedFiles:
    """The outputs root's paths to serve; a complete run folder is checked once (it is renamed into place whole)."""

    def __init__(self, outputs_root: Path) -> None:
        self.root = Path(outputs_root).resolve()
        self._complete: set[Path] = set()
        self._lock = threading.Lock()

    def paths(self) -> list[str]:
        folders = _visible_folders(self.root)
        with self._lock:
            self._complete = {folder for folder in folders if folder in self._complete or is_complete(folder)}
            served = [str(folder) for folder in sorted(self._complete)]
        for tab, names in REPORTS.items():
            for stamp in _visible_folders(self.root / tab):
                served += [str(stamp / name) for name in names if not (stamp / name).is_symlink()]
        return served


class StudioBlocks(gr.Blocks):
    """``gr.Blocks`` whose ``allowed_paths`` are the ones ``launch`` sets plus :class:`ServedFiles`, current."""

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
