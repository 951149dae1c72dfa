"""``reproduce``: run a whole sample set as normal run folders and judge it against a reference.

The run folders live under ``OUT/runs/``; an entry whose complete run folder with the same
request, layout and engine is already there is skipped, so an interrupted set resumes. A
failing entry is recorded and the rest still run. The report (``report.json``, ``.md``,
``.html``) is rewritten atomically after every entry.

References and verdicts live in :mod:`.references`, the report writers in :mod:`.reproduce_report`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import Cancelled, InputError
from ..vocabulary.layouts import Layout
from ..engines.base import ProgressCallback
from .references import (DIFFERS, IDENTICAL, NOT_IN_REFERENCE, condition_differences, hash_verdict,
                         run_conditions, timing_checks, weights_identity)
from .reproduce_report import write_reports
from ..run_folder.runs import RunFolder, check_outputs_root, execute, is_complete, verify_run
from .samples import Sample, SampleSet

REPORT_FORMAT = "magi2studio-reproduce-report/1"


# ----------------------------------------------------------------------------- running


@dataclass
class SampleResult:
    index: int
    name: str
    status: str  # ran | resumed | failed | skipped | cancelled
    mode: str
    seed: int
    seed_source: str
    tier: str
    layout: str
    steps: int | None = None
    run_name: str | None = None
    run_path: str | None = None
    manifest: dict[str, Any] | None = None
    gate_ms: float | None = None
    error: str | None = None
    verdict: str | None = None
    verdict_notes: list[str] = field(default_factory=list)
    timing: list[dict] = field(default_factory=list)

    def row(self, out: Path) -> dict[str, Any]:
        """The report's row; the poster path is relative to the report's folder."""

        row = asdict(self)
        manifest = row.pop("manifest")
        row["frames_sha256"] = manifest["hashes"]["frames_sha256"] if manifest else None
        row["pcm_sha256"] = manifest["hashes"]["pcm_sha256"] if manifest else None
        row["poster"] = os.path.relpath(Path(self.run_path) / "poster.jpg", out) if manifest else None
        return row


@functools.lru_cache(maxsize=256)
def image_digest(path: str, mtime_ns: int, size: int) -> str:
    """sha256 of an image, cached per (path, mtime, size): resuming compares many run folders."""

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def engine_weights(engine) -> str | None:
    """:func:`weights_identity` of the runs ``engine`` would write now (its weights, not the manifest's)."""

    return weights_identity(engine.info()) if getattr(engine, "name", None) == "embedded" else None


def run_key(request: dict[str, Any], layout_name: str, engine_name: str, weights: str | None = None) -> str | None:
    """What makes two runs of an entry the same run: the request by content, the layout, the engine and
    its weights (:func:`weights_identity`: a run of other weights has other hashes).

    The prompt file's path is left out (its text is the request's prompt) and the image is
    taken by its sha256, so a set that was moved or uploaded again still resumes. None when
    the image is gone: nothing can then be shown to be the same run.
    """

    content = {key: value for key, value in request.items() if key != "prompt_file"}
    if content.get("image"):
        image = Path(content["image"])
        if not image.is_file():
            return None
        stat = image.stat()
        content["image"] = image_digest(str(image.resolve()), stat.st_mtime_ns, stat.st_size)
    text = json.dumps({"request": content, "layout": layout_name, "engine": engine_name, "weights": weights},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def manifest_key(manifest: dict[str, Any]) -> str | None:
    try:
        return run_key(manifest["request"], manifest["layout"]["name"], manifest["engine"]["name"],
                       weights_identity(manifest["engine"]))
    except (KeyError, TypeError, AttributeError):
        return None


def find_complete_run(runs_root: Path, key: str) -> Path | None:
    """A complete run folder of exactly this request, layout and engine, whoever wrote it, that verifies
    (run id, fields, file hashes): an edited or damaged folder is run again, not resumed as the result."""

    if not runs_root.is_dir():
        return None
    for folder in sorted(runs_root.iterdir()):
        if folder.name.startswith(".") or not is_complete(folder):
            continue
        try:
            manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if manifest_key(manifest) != key:
            continue
        try:
            verify_run(folder)
        except (InputError, OSError):
            continue
        return folder
    return None


EventCallback = Callable[[str, "SampleResult | None", Any], None]
# Runs one entry into a run folder: (sample, manifest extra, on_progress, cancel) -> RunFolder.
RunEntry = Callable[[Sample, dict[str, Any], ProgressCallback, "threading.Event | None"], RunFolder]


def judge(result: SampleResult, reference: dict[str, Any] | None) -> None:
    if reference is None or result.manifest is None:
        return
    entry = reference["samples"].get(result.name)
    if entry is None:
        result.verdict = NOT_IN_REFERENCE
        return
    result.verdict, result.verdict_notes = hash_verdict(entry["hashes"], result.manifest["hashes"])
    differences = condition_differences(entry.get("conditions", {}), run_conditions(result.manifest))
    if differences:
        result.verdict_notes.append("conditions differ from the reference (" + "; ".join(differences) + ")")
    result.timing = timing_checks(entry, result.manifest, result.gate_ms)


def reproduce(sample_set: SampleSet, *, engine_name: str, layout: Layout, out: Path,
              engine_options: dict[str, Any] | None = None, runs_root: Path | None = None,
              run_entry: RunEntry | None = None, reference: dict[str, Any] | None = None,
              reference_path: str | None = None, on_event: EventCallback | None = None,
              cancel: threading.Event | None = None, weights: str | None = None) -> dict[str, Any]:
    """Run every entry not already done; return the report (also written under ``out``).

    Runs go to ``runs_root`` (default ``out/runs``) on an engine of this process, or through
    ``run_entry`` when the caller owns the engine (the studio's shared slot); that caller passes
    ``weights`` (:func:`engine_weights` of its engine), so only runs of those weights resume.
    """

    from ..engines import get_engine

    close = lambda: None  # noqa: E731
    if run_entry is None:
        engine = get_engine(engine_name, **dict(engine_options or {}))
        for sample in {s.request.tier: s for s in sample_set.samples}.values():
            engine.plan(sample.request, layout)  # a layout this engine cannot run is refused before any run
        close = engine.close
        weights = engine_weights(engine)

        def run_entry(sample, extra, on_progress, cancel_event):
            return execute(engine, sample.request, layout, runs_root, cancel=cancel_event, extra=extra,
                           on_progress=on_progress)

    out = check_outputs_root(Path(out))
    runs_root = check_outputs_root(Path(runs_root) if runs_root else out / "runs")
    results: list[SampleResult] = [
        SampleResult(s.index, s.name, "skipped", s.mode, sample_set.seed, sample_set.seed_policy, "-", layout.name,
                     error=s.reason) for s in sample_set.skipped]
    pending = list(sample_set.samples)
    emit = on_event or (lambda kind, result, payload: None)
    try:
        while pending:
            sample = pending.pop(0)
            request = sample.request
            result = SampleResult(sample.index, sample.name, "ran", request.mode, request.seed, sample.seed_source,
                                  request.tier, layout.name, steps=request.steps)
            key = run_key(request.model_dump(mode="json"), layout.name, engine_name, weights)
            existing = find_complete_run(runs_root, key) if key else None
            emit("start", result, None)
            try:
                if existing is not None:
                    result.status, folder = "resumed", existing
                    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
                else:
                    extra = {"reproduce": {"sample": sample.name, "index": sample.index,
                                           "sample_set": str(sample_set.path), "seed_policy": sample_set.seed_policy,
                                           "base_seed": sample_set.seed, "seed_source": sample.seed_source}}
                    run = run_entry(sample, extra, lambda progress: emit("progress", result, progress), cancel)
                    folder, manifest = run.path, run.manifest
                result.run_name, result.run_path, result.manifest = folder.name, str(folder), manifest
                result.steps = manifest.get("resolved", {}).get("steps", request.steps)
                result.gate_ms = manifest["timing"]["stages"].get("preview", {}).get("gate_ms")
                judge(result, reference)
            except Cancelled:
                result.status = "cancelled"
                results.append(result)
                results.extend(SampleResult(s.index, s.name, "cancelled", s.request.mode, s.request.seed,
                                            s.seed_source, s.request.tier, layout.name) for s in pending)
                pending = []
                raise
            except Exception as err:  # one entry failing must not stop the set
                result.status, result.error = "failed", f"{err.__class__.__name__}: {err}"
            results.append(result)
            emit("done", result, None)
            write_reports(out, build_report(sample_set, engine_name, layout, results, reference, reference_path, out))
    finally:
        close()
        report = build_report(sample_set, engine_name, layout, results, reference, reference_path, out)
        write_reports(out, report)
    return report


# ----------------------------------------------------------------------------- reports


def uncheckable_notes(engine_name: str, reference: dict[str, Any] | None) -> list[str]:
    notes = []
    if engine_name == "embedded":
        notes.append("This run used the embedded engine: upstream's MAGI-2 code at a tiny configuration with tiny "
                     "weights (the shipped trained checkpoint, seeded random ones or a checkpoint folder: each run's "
                     "manifest names them) on CPU. Its hashes and ms/step describe that engine only; no published "
                     "hash or timing of the 114B model can be checked with it.")
    if reference is not None:
        for name, entry in reference["samples"].items():
            for figure in entry.get("timing", []):
                device = entry.get("conditions", {}).get("device")
                if device:
                    notes.append(f"{name}: {figure['gate_ms']} ms/step ({figure['layout']}) was measured on {device} "
                                 f"({figure['source']}); a figure is only comparable on the same devices and layout.")
    return notes


def build_report(sample_set: SampleSet, engine_name: str, layout: Layout, results: list[SampleResult],
                 reference: dict[str, Any] | None, reference_path: str | None, out: Path) -> dict[str, Any]:
    rows = [r.row(out) for r in sorted(results, key=lambda r: r.index)]
    count = lambda key, value: sum(1 for r in rows if r[key] == value)  # noqa: E731
    return {
        "format": REPORT_FORMAT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "sample_set": sample_set.describe(),
        "engine": engine_name,
        "layout": layout.name,
        "reference": {"path": reference_path, "title": reference.get("title")} if reference else None,
        "summary": {status: count("status", status) for status in ("ran", "resumed", "failed", "skipped", "cancelled")}
        | {verdict: count("verdict", verdict) for verdict in (IDENTICAL, DIFFERS, NOT_IN_REFERENCE)},
        "samples": rows,
        "cannot_check_here": uncheckable_notes(engine_name, reference),
    }
