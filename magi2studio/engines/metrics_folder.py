"""The metrics folder: how real-engine workers hand step records and progress to magi2studio.

One protocol, both sides. The worker plugin (:mod:`magi2studio.plugin`) writes: each rank appends
its step records to ``steps-rank<N>.jsonl``, rank 0 appends one ``progress.jsonl`` line per
finished step, rank 0 writes the live preview into ``preview/``, and ``kernels.json`` records the
installed kernels. The engine writes one file: ``preview-request.json``, the next request's preview
rate, which rank 0 reads at each sample's start. The engine child
(:mod:`.engines.vllm_omni.worker`) and the server engine (:mod:`.engines.vllm_omni.server`) read
it back by byte offset, so each request gets only its own records.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

ENV_METRICS_DIR = "MAGI2STUDIO_METRICS_DIR"
ENV_CANCEL_FILE = "MAGI2STUDIO_CANCEL_FILE"
PROGRESS_FILE = "progress.jsonl"
ENV_PREVIEW_MAP = "MAGI2STUDIO_PREVIEW_MAP"
ENV_PREVIEW_EVERY = "MAGI2STUDIO_PREVIEW_EVERY"


def steps_file(metrics_dir: str | Path, rank: int) -> Path:
    return Path(metrics_dir) / f"steps-rank{rank}.jsonl"


def kernels_file(metrics_dir: str | Path) -> Path:
    """Same env and platform on every rank, so one file (the last rank to start writes it)."""

    return Path(metrics_dir) / "kernels.json"


def test_checkpoint_file(metrics_dir: str | Path) -> Path:
    """The test checkpoint's depth as the plugin applied it (absent for real weights)."""

    return Path(metrics_dir) / "test-checkpoint.json"


def preview_folder(metrics_dir: str | Path) -> Path:
    """Rank 0's live preview pictures and ``preview.json`` (engines.live_preview.read_latest reads it)."""

    return Path(metrics_dir) / "preview"


def preview_request_file(metrics_dir: str | Path) -> Path:
    return Path(metrics_dir) / "preview-request.json"


def write_preview_request(metrics_dir: str | Path, every: int) -> None:
    """Before a request: its preview rate (0: off) for rank 0, and an empty ``preview/``.

    The workers start once per start options (a 307 GB model load), so a per-request rate comes
    through this file, not through their env; the previous request's pictures are removed so that
    this request's progress shows none of them. Called only while no request runs.
    """

    import shutil

    shutil.rmtree(preview_folder(metrics_dir), ignore_errors=True)
    target = preview_request_file(metrics_dir)
    temp = target.with_name(f".{target.name}.tmp")
    temp.write_text(json.dumps({"every": every}), encoding="utf-8")
    temp.replace(target)


def read_preview_request(metrics_dir: str | Path) -> int | None:
    """The rate :func:`write_preview_request` left, or None where no engine wrote one (a hand-started server)."""

    try:
        return int(json.loads(preview_request_file(metrics_dir).read_text(encoding="utf-8"))["every"])
    except FileNotFoundError:
        return None


def step_offsets(metrics_dir: Path) -> dict[Path, int]:
    return {path: path.stat().st_size for path in metrics_dir.glob("steps-rank*.jsonl")}


def records_since(metrics_dir: Path, offsets: dict[Path, int]) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for path in sorted(metrics_dir.glob("steps-rank*.jsonl")):
        with open(path, "rb") as file:
            file.seek(offsets.get(path, 0))
            records += [json.loads(line) for line in file.read().decode("utf-8").splitlines() if line.strip()]
    return sorted(records, key=lambda r: (r["stage"], r["step"], r["rank"]))


class ProgressFollower(threading.Thread):
    """Forwards rank 0's per-step lines (written by the plugin) while a request runs."""

    def __init__(self, path: Path, emit) -> None:
        super().__init__(daemon=True)
        self.path, self.emit = path, emit
        self.offset = path.stat().st_size if path.exists() else 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.25):
            self.forward()
        self.forward()

    def forward(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as file:
            file.seek(self.offset)
            chunk = file.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.decode("utf-8").splitlines():
            self.emit({"progress": json.loads(line)})
