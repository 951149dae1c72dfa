"""What every tab module receives: ``build(ctx)`` gets one :class:`StudioContext`."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from gradio.utils import get_upload_folder

from ..engines.base import Capabilities, Engine
from .history import forget_deleted
from .slot import EngineSlot

ASSETS = Path(__file__).with_name("assets")
SCRATCH_CAP_BYTES = 512 * 1024 * 1024  # run-folder zips kept for download; a 272p run zips to about 2 MB
MAX_UPLOAD_BYTES = 32 * 1024 * 1024  # Gradio refuses larger uploads (first frames, sets, prompts are far smaller)


def report_links(folder: Path, names: tuple[str, ...]) -> str:
    """Markdown download links to report files in ``folder`` (``served.REPORTS`` lets them out)."""
    return ", ".join(f"[{name}](gradio_api/file={quote(str(Path(folder) / name))})" for name in names)


@dataclass
class StudioContext:
    """Shared state of one studio app, handed to each tab's ``build(ctx)``.

    - ``engine``, ``capabilities``: the engine behind the studio and what it can run here.
    - ``slot``: the one :class:`EngineSlot` (bounded FIFO queue) every session submits to;
      a tab that generates calls ``ctx.slot.submit(ctx.engine.plan(request, layout), owner)`` and
      ``ctx.slot.follow(job)``; ``owner`` is who may act on the job (``job_panel``: the page's browser id,
      else ``job_panel.session_owner(request)``).
    - ``outputs_root``: where run folders are written; not served as a folder: components get cached
      copies of what they show (``served.cached``), and only the linked reports are served from it.
    - ``scratch``: a private temp folder for derived files (run-folder zips, staged uploads);
      zips are capped at ``scratch_cap_bytes`` (oldest removed first), and ``close()``
      removes the folder at shutdown.
    - ``uploads``: Gradio's upload folder; files a client names must lie in it.
    - ``gpu_gib``: GPU memory assumed by the layout memory-fit line (real checkpoint).
    - ``demo``: the ``gr.Blocks`` being built (for ``demo.load`` events).
    - ``tabs``: the ``gr.Tabs``; switch with ``gr.Tabs(selected=<tab id>)`` as an output.
      Create every component of a tab inside its ``gr.Tab`` block: one left between two
      tabs shifts the later tabs' order (their buttons then show the wrong label).
    - ``form``: set by the Generate tab: its ``GenerateForm`` (the request fields, and
      ``values_from_manifest(manifest)`` to fill them back in, in ``form.fields`` order).
    - ``results``: set by the Results tab: its ``ResultsView`` (``components`` and
      ``values_for(run)`` giving their values for a run folder).
    - ``defer(fn)``: run ``fn()`` inside the Blocks context after every tab is built, for
      wiring events to components another tab creates.
    """

    engine: Engine
    capabilities: Capabilities
    slot: EngineSlot
    outputs_root: Path
    gpu_gib: float = 80.0
    scratch: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="magi2studio-")))
    scratch_cap_bytes: int = SCRATCH_CAP_BYTES
    uploads: Path = field(default_factory=lambda: Path(get_upload_folder()))
    demo: Any = None
    tabs: Any = None
    form: Any = None
    results: Any = None
    _deferred: list[Callable[[], None]] = field(default_factory=list)

    def defer(self, fn: Callable[[], None]) -> None:
        self._deferred.append(fn)

    def run_deferred(self) -> None:
        for fn in self._deferred:
            fn()
        self._deferred.clear()

    def trim_scratch(self, keep: Path) -> None:
        """Remove the oldest zips until the scratch folder's zips fit ``scratch_cap_bytes`` (``keep`` stays)."""
        zips = sorted(self.scratch.glob("*.zip"), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in zips)
        for path in zips:
            if total <= self.scratch_cap_bytes:
                break
            if path != keep:
                total -= path.stat().st_size
                path.unlink(missing_ok=True)

    def close(self) -> None:
        """Remove the scratch folder (zips, staged uploads): nothing of the studio's stays in /tmp; and the
        run History kept to undo its last delete (the undo ends with the studio)."""
        shutil.rmtree(self.scratch, ignore_errors=True)
        forget_deleted(self.outputs_root)

