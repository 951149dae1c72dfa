"""Run folders: one request in, one complete folder out, never half a folder.

``outputs/<time>-<mode>-<tier>-s<seed>-<run id>/`` holds request.yaml, manifest.json,
steps.jsonl, video.mp4 (with the audio track and the request in its metadata), audio.wav
and poster.jpg. Everything is written into a hidden temp folder beside it and renamed into
place once complete; a cancelled or failed run leaves nothing. The run id is the first 16 hex
digits of manifest.json's sha256, and the manifest holds every other file's sha256, so the name
covers the folder: an edit of any file shows without a re-run (``verify_run``).

Over 300 lines on purpose: the writer and its readers (``verify_run``, ``read_manifest``, the run
id check) share the manifest's shape and the run-id rule; apart, one could change without the other.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import determinism, media
from . import provenance
from ..engines import ENGINE_NAMES
from ..engines.base import Engine, Generation, Plan, Progress, ProgressCallback
from ..errors import Cancelled, InputError, os_error_naming
from ..vocabulary.layouts import Layout, parse_layout
from ..vocabulary.paths import read_text
from ..vocabulary.request import Request, build_request
from ..engines.timing import gate_summary

MANIFEST_VERSION = 1
RUN_FILES = ("request.yaml", "manifest.json", "steps.jsonl", "video.mp4", "audio.wav", "poster.jpg")


@dataclass(frozen=True)
class RunFolder:
    path: Path
    manifest: dict[str, Any]

    @property
    def video(self) -> Path:
        return self.path / "video.mp4"

    @property
    def wav(self) -> Path:
        return self.path / "audio.wav"

    @property
    def poster(self) -> Path:
        return self.path / "poster.jpg"

    @property
    def steps(self) -> Path:
        return self.path / "steps.jsonl"


def check_outputs_root(root: Path) -> Path:
    """Create the outputs root if needed and prove it is writable, before any engine work.

    A path that is no folder is bad input (InputError, exit 2); a folder the system will not let this
    user write (permission, read-only filesystem, quota) is a refused write, the OSError itself with the
    folder as its file name (exit 1), as it is when the system refuses a write later in the run.
    """

    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".probe-"):
            pass
    except (FileExistsError, NotADirectoryError):
        raise InputError("out", f"{root} is not a folder (it or a folder above it is a file)",
                         "choose a folder with --out") from None
    except OSError as err:
        raise os_error_naming(err, str(root)) from err
    return root


def run_stem(request: Request, when: float | None = None) -> str:
    """The run folder's name before its run id: ``<time>-<mode>-<tier>-s<seed>``."""

    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(when))
    return f"{stamp}-{request.mode}-{request.tier}-s{request.seed}"


def is_complete(path: Path) -> bool:
    return path.is_dir() and all((path / name).is_file() for name in RUN_FILES)


MAX_MANIFEST_BYTES = 16 * 1024 * 1024
HASHED_FILES = ("request.yaml", "steps.jsonl", "video.mp4", "audio.wav", "poster.jpg")
_SHA256 = re.compile(r"[0-9a-f]{64}")
RUN_ID_HEX = 16  # 64 bits: an edit tried over and over until its digest matches a given name takes ~2**64 tries
_RUN_ID = re.compile(rf"[0-9a-f]{{{RUN_ID_HEX}}}")
RUN_ID_KEY = "run_id"
RUN_ID_RULE = (f"the last part of this run folder's name: the first {RUN_ID_HEX} hex digits of this manifest.json's "
               "sha256. The manifest holds every other file's sha256, so `magi2studio verify` names any edited file "
               "without a re-run. An unkeyed digest: it shows edits, not a forger who also renames the folder")
# Recorded, but not recomputable from the files: the hashes are of the arrays before encoding (lossy H.264, 16-bit WAV).
REPLAY_ONLY_HASHES = ("frames_sha256", "pcm_sha256")
TAMPERED_FIX = "re-run it (magi2studio generate --request request.yaml from a copy you trust)"


def read_manifest(path: Path) -> dict[str, Any]:
    """A run folder's manifest.json, parsed and its shape checked; every flaw one InputError line."""

    file = Path(path) / "manifest.json"
    text = read_text(file, "manifest", "the manifest.json of a run folder", MAX_MANIFEST_BYTES)
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError("manifest", f"{file} is not valid JSON (line {err.lineno}: {err.msg}); it is truncated "
                         "or was edited", "use an intact run folder (re-run it with generate)") from None
    except RecursionError:
        raise InputError("manifest", f"{file} nests too deeply", "use a manifest written by magi2studio") from None
    if not isinstance(manifest, dict):
        raise InputError("manifest", f"{file} holds a JSON {type(manifest).__name__}, not an object",
                         "use a manifest written by magi2studio")
    shapes = {"request": dict, "resolved": dict, "layout": dict, "engine": dict, "hashes": dict, "files": dict}
    for key, kind in shapes.items():
        if not isinstance(manifest.get(key), kind):
            problem = ("is missing" if key not in manifest
                       else f"is a JSON {type(manifest[key]).__name__}, not an object")
            raise InputError(f"manifest.{key}", problem, "use a manifest written by magi2studio")
    if manifest.get("manifest_version") != MANIFEST_VERSION:
        raise InputError("manifest.manifest_version", f"is {manifest.get('manifest_version')!r}",
                         f"use a manifest of version {MANIFEST_VERSION} (written by this magi2studio)")
    for key in ("frames_sha256", "pcm_sha256"):
        if not isinstance(manifest["hashes"].get(key), str) or not _SHA256.fullmatch(manifest["hashes"][key]):
            raise InputError(f"manifest.hashes.{key}", "is not a sha256", "use a manifest written by magi2studio")
    for key in ("layout", "engine"):
        if not isinstance(manifest[key].get("name"), str):
            raise InputError(f"manifest.{key}.name", "is missing", "use a manifest written by magi2studio")
    return manifest


def load_run(path: Path) -> RunFolder:
    path = Path(path)
    if not is_complete(path):
        raise InputError("run", f"{path} is not a complete run folder", "give a folder written by magi2studio")
    return RunFolder(path, read_manifest(path))


def manifest_request(manifest: dict[str, Any]) -> Request:
    """The manifest's request, validated by the request model (its refusals, prefixed ``manifest.request.``)."""

    try:
        return build_request(**manifest["request"])
    except InputError as err:
        raise InputError(f"manifest.request.{err.field}", err.problem, err.fix) from None
    except TypeError:  # keys that are not strings
        raise InputError("manifest.request", "has keys that are not field names",
                         "use a manifest written by magi2studio") from None


@dataclass(frozen=True)
class VerifiedRun(RunFolder):
    """A run folder that passed ``verify_run``; ``manifest_covered``: its run id is its manifest's digest
    (False: a folder made before run ids were, whose manifest nothing but a re-run can check)."""

    manifest_covered: bool


def run_id_of(path: Path) -> str:
    """The run id a folder's manifest.json gives it: the first 16 hex digits of the file's sha256."""

    return media.file_sha256(Path(path) / "manifest.json")[:RUN_ID_HEX]


def check_run_id(path: Path) -> bool:
    """Whether the folder's name ends in its manifest's digest; an edited manifest is refused by name.

    False for a name whose last part is no run id of 16 hex digits (a folder made before run ids were
    digests, or renamed): ``verify_run`` then tells those apart by the manifest's ``run_id`` key.
    """

    given, digest = path.name.rsplit("-", 1)[-1], run_id_of(path)
    if given == digest:
        return True
    if _RUN_ID.fullmatch(given):
        raise InputError("run", f"{path} was tampered with: manifest.json was edited after the run (its sha256 "
                         f"starts {digest}, the run id in the folder's name is {given})", TAMPERED_FIX)
    return False


def verify_run(path: Path) -> VerifiedRun:
    """Check a run folder without re-running it: manifest.json against the run id in the folder's name,
    its fields, every other file's sha256, and that the request in manifest.json is the one in
    request.yaml. Refuses a tampered folder by name. ``REPLAY_ONLY_HASHES`` only a re-run can check."""

    path = Path(path)
    if not is_complete(path):
        raise InputError("run", f"{path} is not a complete run folder", "give a folder written by magi2studio")
    covered = check_run_id(path)  # before the fields: an edited manifest is tampering, whatever it now says
    folder = load_run(path)
    manifest = folder.manifest
    if not covered and RUN_ID_KEY in manifest:
        raise InputError("run", f"{path} was renamed or tampered with: its manifest gives it the run id "
                         f"{run_id_of(path)}, which its name does not end in",
                         f"if you renamed it, give it back its name ending -{run_id_of(path)}; otherwise "
                         + TAMPERED_FIX)
    for name in HASHED_FILES:
        recorded = manifest["files"].get(name)
        if not isinstance(recorded, str) or not _SHA256.fullmatch(recorded):
            raise InputError(f"manifest.files.{name}", "has no sha256", "use a manifest written by magi2studio")
        if media.file_sha256(folder.path / name) != recorded:
            raise InputError("run", f"{folder.path} was tampered with: {name} differs from the sha256 in its manifest",
                             TAMPERED_FIX)
    request = manifest_request(manifest)
    if request.model_dump(mode="json") != manifest["request"]:
        raise InputError("manifest.request", "is not in the normal form magi2studio writes", TAMPERED_FIX)
    written = Request.from_yaml((folder.path / "request.yaml").read_text(encoding="utf-8"), source="request.yaml")
    if written.model_dump(mode="json") != manifest["request"]:
        raise InputError("run", f"{folder.path} was tampered with: manifest.json's request differs from request.yaml",
                         TAMPERED_FIX)
    parse_layout(manifest["layout"]["name"])
    if manifest["engine"]["name"] not in ENGINE_NAMES:
        raise InputError("manifest.engine.name", f"{manifest['engine']['name']!r} is not an engine",
                         f"use one of {', '.join(ENGINE_NAMES)}")
    return VerifiedRun(folder.path, manifest, covered)


def timing_summary(generation: Generation) -> dict[str, Any]:
    stages = sorted({r["stage"] for r in generation.step_records}, key=lambda s: (s != "preview", s))
    return {
        "metric": "per step the slowest rank; steps 0 and 1 dropped; mean of the rest (MUSA report 2.1)",
        "stages": {stage: gate_summary(generation.step_records, stage) for stage in stages},
        "stage_ms": generation.stage_ms,
    }


def build_manifest(plan: Plan, generation: Generation, started: float,
                   extra: dict[str, Any] | None = None) -> dict[str, Any]:
    request, tier, layout = plan.request, plan.tier, plan.layout
    return {
        "manifest_version": MANIFEST_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "request": request.model_dump(mode="json"),
        "resolved": generation.resolved,
        "layout": {**layout.as_dict(), "vae_patch_parallel_size": layout.vae_patch_parallel(tier)},
        "engine": generation.engine_info,
        "output": {
            "frames": int(generation.frames.shape[0]),
            "width": int(generation.frames.shape[2]),
            "height": int(generation.frames.shape[1]),
            "fps": generation.fps,
            "audio_samples": int(generation.audio.shape[0]),
            "audio_channels": int(generation.audio.shape[1]),
            "sample_rate": generation.sample_rate,
        },
        "hashes": {
            "frames_sha256": media.frames_sha256(generation.frames),
            "pcm_sha256": media.pcm_sha256(generation.audio),
            **({"latents_sha256": generation.latents_sha256} if generation.latents_sha256 else {}),
            "what_hashes_prove": determinism.WHAT_HASHES_PROVE,
        },
        "timing": timing_summary(generation),
        "environment": determinism.recorded(),
        "cpu_capability": determinism.cpu_capability(),
        "versions": provenance.package_versions(),
        "build_info": provenance.build_info(),
        RUN_ID_KEY: RUN_ID_RULE,
        **(extra or {}),
    }


@contextmanager
def _naming_the_file(name: str, root: Path) -> Iterator[None]:
    """A refused write names the run folder's file: Python's and the wave module's writes name none,
    PyAV's the hidden temp folder, which is gone by the time the user reads it."""

    try:
        yield
    except OSError as err:
        raise os_error_naming(err, f"{name} of the run folder being written in {root}") from err


def _stop_if_cancelled(cancel: threading.Event | None, what: str) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled(what, where="before the run folder was written")


def write_run(root: Path, plan: Plan, generation: Generation, started: float,
              extra: dict[str, Any] | None = None, cancel: threading.Event | None = None) -> RunFolder:
    """Write every file into a temp folder, then rename it into place under its run id.

    ``cancel`` is checked before each file and before the rename (the last point a cancel can land:
    after it the run is done); a cancel removes the temp folder, so no run folder appears."""

    request = plan.request
    root = check_outputs_root(root)
    stem = run_stem(request, started)
    temp = Path(tempfile.mkdtemp(prefix=f".{stem}.", dir=root))
    try:
        manifest = build_manifest(plan, generation, started, extra)
        mp4_metadata = {"comment": json.dumps({"magi2studio_request": manifest["request"],
                                               "engine": generation.engine_info.get("name")})}
        writers: dict[str, Callable[[Path], None]] = {
            "request.yaml": lambda path: path.write_text(request.to_yaml(), encoding="utf-8"),
            "steps.jsonl": lambda path: path.write_text(
                "".join(json.dumps(record, sort_keys=True) + "\n" for record in generation.step_records),
                encoding="utf-8"),
            "video.mp4": lambda path: media.write_mp4(path, generation.frames, generation.audio, generation.fps,
                                                      generation.sample_rate, mp4_metadata),
            "audio.wav": lambda path: media.write_wav(path, generation.audio, generation.sample_rate),
            "poster.jpg": lambda path: media.write_poster(path, generation.frames),
        }
        t0 = time.perf_counter()
        for name, write in writers.items():
            _stop_if_cancelled(cancel, f"stopped while writing the run folder, before {name}; nothing was kept")
            with _naming_the_file(name, root):
                write(temp / name)
        manifest["timing"]["stage_ms"]["mux"] = (time.perf_counter() - t0) * 1e3
        manifest["files"] = {name: media.file_sha256(temp / name) for name in HASHED_FILES}
        with _naming_the_file("manifest.json", root):
            (temp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=False), encoding="utf-8")
        final = root / f"{stem}-{run_id_of(temp)}"
        _stop_if_cancelled(cancel, "stopped with the run folder written but not yet in place; nothing was kept")
        os.chmod(temp, 0o755)
        os.rename(temp, final)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return RunFolder(final, manifest)


def execute(engine: Engine, request: Request, layout: Layout, outputs_root: Path, *,
            on_progress: ProgressCallback | None = None, cancel: threading.Event | None = None,
            extra: dict[str, Any] | None = None) -> RunFolder:
    """Plan (check the request and layout once), then run the plan into a run folder."""

    plan = engine.plan(request, layout)  # before the outputs root is made: a refusal leaves no ./outputs
    return execute_plan(engine, plan, outputs_root, on_progress=on_progress, cancel=cancel, extra=extra)


def execute_plan(engine: Engine, plan: Plan, outputs_root: Path, *,
                 on_progress: ProgressCallback | None = None, cancel: threading.Event | None = None,
                 extra: dict[str, Any] | None = None) -> RunFolder:
    """(Re)start the engine for the plan's layout, generate, and write the run folder.

    ``cancel`` reaches the engine's start and run, and is checked again before and while the folder is
    written, so a cancel that lands after the last step (in a decode, in the mux) still keeps no folder."""

    check_outputs_root(outputs_root)
    started = time.time()
    if engine.start(plan.layout, cancel=cancel) and on_progress is not None:
        on_progress(Progress("load", message=f"engine started for layout {plan.layout.name}"))
    generation = engine.generate(plan, on_progress=on_progress, cancel=cancel)
    _stop_if_cancelled(cancel, "stopped after the engine's run, before the run folder was written")
    if on_progress is not None:
        on_progress(Progress("mux", message="writing the run folder"))
    return write_run(outputs_root, plan, generation, started, extra, cancel)
