"""``reproduce``: run a whole sample set as normal run folders and judge it against a reference.

The run folders live under ``OUT/runs/``; an entry whose complete run folder with the same
request, layout and engine is already there is skipped, so an interrupted set resumes. A
failing entry is recorded and the rest still run. The report (``report.json``, ``.md``,
``.html``) is rewritten atomically after every entry.

A reference file holds, per sample, output hashes (full, or a prefix as published) and
timing figures with their source. One transcribed from the blog ships as ``blog``.
"""

from __future__ import annotations

import functools
import hashlib
import html
import json
import os
import re
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import Cancelled, InputError
from .layouts import Layout, parse_layout
from .engines.base import ProgressCallback
from .runs import RunFolder, check_outputs_root, execute, is_complete
from .samples import Sample, SampleSet

REFERENCE_FORMAT = "magi2studio-reference/1"
REPORT_FORMAT = "magi2studio-reproduce-report/1"
REFERENCES_DIR = Path(__file__).parent / "data" / "references"
BUNDLED_REFERENCES = {"blog": REFERENCES_DIR / "blog-272p.json"}
HASH_KEYS = ("frames_sha256", "pcm_sha256")
CONDITION_KEYS = ("engine", "mode", "tier", "steps", "seed", "compile", "layout", "device")
MIN_PREFIX = 8
_HEX = re.compile(r"^[0-9a-f]+$")

IDENTICAL, DIFFERS, NOT_IN_REFERENCE = "identical", "differs", "not in reference"


# ----------------------------------------------------------------------------- references


def resolve_reference_path(text: str | Path) -> Path:
    return BUNDLED_REFERENCES.get(str(text), Path(text))


def load_reference(path: str | Path) -> dict[str, Any]:
    """Read and schema-check a reference file; every problem is one InputError line."""

    file = resolve_reference_path(path)
    if not file.is_file():
        raise InputError("expect", f"{file} does not exist",
                         f"give a reference JSON file, or one of {', '.join(BUNDLED_REFERENCES)}")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError("expect", f"{file} is not valid JSON ({err.__class__.__name__})", "fix the JSON") from None
    check_reference(data, str(file))
    return data


def check_reference(data: Any, where: str = "reference") -> None:
    if not isinstance(data, dict) or data.get("format") != REFERENCE_FORMAT:
        raise InputError("expect", f"{where} is not a magi2studio reference",
                         f'it needs "format": "{REFERENCE_FORMAT}" and a "samples" object')
    samples = data.get("samples")
    if not isinstance(samples, dict) or not samples:
        raise InputError("expect", f"{where}: samples must be a non-empty object keyed by sample name",
                         'write "samples": {"sample_000-t2va": {"hashes": {...}}}')
    for name, entry in samples.items():
        at = f"{where}: samples.{name}"
        if not isinstance(entry, dict):
            raise InputError("expect", f"{at} is not an object", "give hashes, conditions and timing")
        hashes = entry.get("hashes")
        if not isinstance(hashes, dict) or not hashes or set(hashes) - set(HASH_KEYS):
            raise InputError("expect", f"{at}.hashes must hold {' and/or '.join(HASH_KEYS)}",
                             "give the sha256 (or a published prefix) of the frames and/or the PCM")
        for key, value in hashes.items():
            if not isinstance(value, str) or not _HEX.match(value.lower()) or not MIN_PREFIX <= len(value) <= 64:
                raise InputError("expect", f"{at}.hashes.{key} is not a sha256 or a prefix of one",
                                 f"use {MIN_PREFIX} to 64 hex digits")
        conditions = entry.get("conditions", {})
        if not isinstance(conditions, dict) or set(conditions) - set(CONDITION_KEYS):
            raise InputError("expect", f"{at}.conditions has unknown keys",
                             f"use only {', '.join(CONDITION_KEYS)}")
        timing = entry.get("timing", [])
        if not isinstance(timing, list):
            raise InputError("expect", f"{at}.timing must be a list", "write a list of figures")
        for figure in timing:
            ok = (isinstance(figure, dict) and isinstance(figure.get("gate_ms"), (int, float))
                  and not isinstance(figure.get("gate_ms"), bool) and figure["gate_ms"] > 0
                  and isinstance(figure.get("source"), str) and figure["source"].strip()
                  and isinstance(figure.get("layout"), str))
            if not ok:
                raise InputError("expect", f"{at}.timing has a figure without a positive gate_ms, layout and source",
                                 'write {"layout": "sp8-cfg1-ep4", "gate_ms": 565.0, "source": "..."}')
            parse_layout(figure["layout"])


def hash_verdict(reference_hashes: dict[str, str], manifest_hashes: dict[str, str]) -> tuple[str, list[str]]:
    """Identical when every reference hash is (a prefix of) the run's; else which ones differ."""

    differing = [key for key, expected in reference_hashes.items()
                 if not str(manifest_hashes.get(key, "")).lower().startswith(expected.lower())]
    if not differing:
        return IDENTICAL, []
    return DIFFERS, [f"{key}: reference {reference_hashes[key]}, this run {str(manifest_hashes.get(key))[:16]}"
                     for key in differing]


def run_conditions(manifest: dict[str, Any]) -> dict[str, Any]:
    request, resolved = manifest["request"], manifest.get("resolved", {})
    return {
        "engine": manifest.get("engine", {}).get("name"),
        "mode": request["mode"],
        "tier": request["tier"],
        "steps": resolved.get("steps", request.get("steps")),
        "seed": request["seed"],
        "compile": resolved.get("compile", request.get("compile")),
        "layout": manifest["layout"]["name"],
    }


def condition_differences(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    return [f"{key}: reference {expected[key]}, this run {actual.get(key)}"
            for key in expected if key != "device" and key in actual and expected[key] != actual.get(key)]


def timing_checks(reference_entry: dict[str, Any], manifest: dict[str, Any], gate_ms: float | None) -> list[dict]:
    """Each published figure beside this run's measurement, or the reasons it cannot be checked here."""

    conditions = reference_entry.get("conditions", {})
    actual = run_conditions(manifest)
    checks = []
    for figure in reference_entry.get("timing", []):
        reasons = condition_differences({k: v for k, v in conditions.items() if k != "layout"}, actual)
        if figure["layout"] != actual["layout"]:
            reasons.append(f"layout: figure {figure['layout']}, this run {actual['layout']}")
        check = {**figure, "measured_ms": gate_ms, "checkable": not reasons, "why_not": reasons}
        if not reasons and gate_ms is not None:
            check["ratio"] = gate_ms / figure["gate_ms"]
        checks.append(check)
    return checks


def reference_from_report(report: dict[str, Any], title: str) -> dict[str, Any]:
    """A reference recording the full hashes and gate ms of a report's completed runs."""

    host = socket.gethostname()
    samples = {}
    for row in report["samples"]:
        if not row["run_path"]:
            continue
        manifest = json.loads((Path(row["run_path"]) / "manifest.json").read_text(encoding="utf-8"))
        conditions = {k: v for k, v in run_conditions(manifest).items() if v is not None}
        source = f"run folder {row['run_name']} on {host}, {manifest.get('created')}"
        entry = {"conditions": conditions, "hashes": {k: manifest["hashes"][k] for k in HASH_KEYS},
                 "hash_source": source, "timing": []}
        if row["gate_ms"] is not None:
            entry["timing"].append({"layout": conditions["layout"], "gate_ms": row["gate_ms"],
                                    "source": source})
        samples[row["name"]] = entry
    if not samples:
        raise InputError("write_reference", "no entry completed, so there is nothing to record",
                         "fix the failing entries and run again")
    return {"format": REFERENCE_FORMAT, "title": title, "source": f"recorded by magi2studio reproduce on {host}",
            "samples": samples}


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


def run_key(request: dict[str, Any], layout_name: str, engine_name: str) -> str | None:
    """What makes two runs of an entry the same run: the request by content, the layout and the engine.

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
    text = json.dumps({"request": content, "layout": layout_name, "engine": engine_name}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def manifest_key(manifest: dict[str, Any]) -> str | None:
    try:
        return run_key(manifest["request"], manifest["layout"]["name"], manifest["engine"]["name"])
    except (KeyError, TypeError):
        return None


def find_complete_run(runs_root: Path, key: str) -> Path | None:
    """A complete run folder of exactly this request, layout and engine, whoever wrote it."""

    if not runs_root.is_dir():
        return None
    for folder in sorted(runs_root.iterdir()):
        if folder.name.startswith(".") or not is_complete(folder):
            continue
        try:
            manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if manifest_key(manifest) == key:
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
              cancel: threading.Event | None = None) -> dict[str, Any]:
    """Run every entry not already done; return the report (also written under ``out``).

    Runs go to ``runs_root`` (default ``out/runs``) on an engine of this process, or through
    ``run_entry`` when the caller owns the engine (the studio's shared slot).
    """

    from .engines import get_engine
    from .tiers import get_tier

    close = lambda: None  # noqa: E731
    if run_entry is None:
        engine = get_engine(engine_name, **dict(engine_options or {}))
        for tier in sorted({s.request.tier for s in sample_set.samples}):
            engine.check_layout(layout, get_tier(tier))
        close = engine.close

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
            key = run_key(request.model_dump(mode="json"), layout.name, engine_name)
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
        notes.append("This run used the embedded engine: upstream's MAGI-2 code at a tiny configuration with "
                     "generated weights on CPU. Its hashes and ms/step describe that engine only; no published "
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


def write_atomic(path: Path, text: str) -> None:
    """Write beside the target, then rename: a reader never sees half a file."""

    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def short(value: str | None, n: int = 16) -> str:
    return value[:n] if value else "-"


def fmt_ms(value: float | None) -> str:
    return f"{value:.1f}" if isinstance(value, (int, float)) else "-"


def timing_line(check: dict[str, Any]) -> str:
    head = f"{check['layout']} {check['gate_ms']} ms ({check['source']})"
    if check["checkable"]:
        return f"{head}: measured {fmt_ms(check['measured_ms'])} ms"
    return f"{head}: not checkable here ({'; '.join(check['why_not'])})"


def report_markdown(report: dict[str, Any]) -> str:
    ref = report["reference"]
    lines = [
        "# Reproduction report", "",
        f"- sample set: `{report['sample_set']['path']}` (seed {report['sample_set']['seed']}, "
        f"policy {report['sample_set']['seed_policy']})",
        f"- engine: {report['engine']}, layout: {report['layout']}",
        f"- reference: {ref['title'] + ' (' + str(ref['path']) + ')' if ref else 'none'}",
        "- summary: " + ", ".join(f"{k} {v}" for k, v in report["summary"].items()), "",
        "| sample | status | mode | seed | tier | steps | layout | frames sha256 | pcm sha256 | gate ms/step "
        "| verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["samples"]:
        lines.append(
            f"| {row['name']} | {row['status']} | {row['mode']} | {row['seed']} ({row['seed_source']}) | {row['tier']} "
            f"| {row['steps'] or '-'} | {row['layout']} | `{short(row['frames_sha256'])}` "
            f"| `{short(row['pcm_sha256'])}` "
            f"| {fmt_ms(row['gate_ms'])} | {row['verdict'] or '-'} |")
    details = [row for row in report["samples"] if row["error"] or row["verdict_notes"] or row["timing"]]
    if details:
        lines += ["", "## Details", ""]
        for row in details:
            for text in ([row["error"]] if row["error"] else []) + row["verdict_notes"] + [
                    timing_line(c) for c in row["timing"]]:
                lines.append(f"- **{row['name']}**: {text}")
    if report["cannot_check_here"]:
        lines += ["", "## What cannot be checked here", ""] + [f"- {note}" for note in report["cannot_check_here"]]
    return "\n".join(lines) + "\n"


def report_html(report: dict[str, Any]) -> str:
    e = html.escape
    ref = report["reference"]
    head = (f"<p>Sample set <code>{e(report['sample_set']['path'])}</code>, seed {report['sample_set']['seed']} "
            f"({e(report['sample_set']['seed_policy'])}); engine {e(report['engine'])}, layout {e(report['layout'])}; "
            f"reference {e(ref['title'] or '') + ' <code>' + e(str(ref['path'])) + '</code>' if ref else 'none'}.</p>"
            f"<p>{e(', '.join(f'{k} {v}' for k, v in report['summary'].items()))}</p>")
    rows = []
    for row in report["samples"]:
        poster = f'<img src="{e(row["poster"])}" width="160" alt="poster of {e(row["name"])}">' if row["poster"] else ""
        notes = [row["error"]] if row["error"] else []
        notes += row["verdict_notes"] + [timing_line(c) for c in row["timing"]]
        rows.append(
            "<tr>" + "".join(f"<td>{cell}</td>" for cell in (
                poster, e(row["name"]), e(row["status"]), e(row["mode"]), f"{row['seed']} ({e(row['seed_source'])})",
                e(row["tier"]), e(str(row["steps"] or "-")), e(row["layout"]),
                f"<code>{e(short(row['frames_sha256']))}</code>", f"<code>{e(short(row['pcm_sha256']))}</code>",
                e(fmt_ms(row["gate_ms"])), f'<b class="{e((row["verdict"] or "none").replace(" ", "-"))}">'
                f'{e(row["verdict"] or "-")}</b>', "<br>".join(e(n) for n in notes))) + "</tr>")
    cannot = "".join(f"<li>{e(note)}</li>" for note in report["cannot_check_here"])
    return (
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Reproduction report</title><style>"
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
        "padding:4px 8px;vertical-align:top}.identical{color:#070}.differs{color:#b00}</style></head><body>"
        f"<h1>Reproduction report</h1>{head}<table><tr><th>poster</th><th>sample</th><th>status</th><th>mode</th>"
        "<th>seed</th><th>tier</th><th>steps</th><th>layout</th><th>frames sha256</th><th>pcm sha256</th>"
        f"<th>gate ms/step</th><th>verdict</th><th>notes</th></tr>{''.join(rows)}</table>"
        + (f"<h2>What cannot be checked here</h2><ul>{cannot}</ul>" if cannot else "") + "</body></html>\n")


def write_reports(out: Path, report: dict[str, Any]) -> dict[str, Path]:
    paths = {"json": out / "report.json", "md": out / "report.md", "html": out / "report.html"}
    write_atomic(paths["json"], json.dumps(report, indent=2, default=str) + "\n")
    write_atomic(paths["md"], report_markdown(report))
    write_atomic(paths["html"], report_html(report))
    return paths
