"""Reference files: per sample, the output hashes (full, or a prefix as published) and timing
figures with their source, and the verdict of a run against them.

A reference is ``{"format": "magi2studio-reference/1", "title", "source", "samples": {name:
{"conditions", "hashes", "hash_source", "timing": [...]}}}``; one transcribed from the blog
ships as ``blog``.
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..vocabulary.layouts import parse_layout

REFERENCE_FORMAT = "magi2studio-reference/1"
REFERENCES_DIR = Path(__file__).resolve().parents[1] / "data" / "references"
BUNDLED_REFERENCES = {"blog": REFERENCES_DIR / "blog-272p.json"}
HASH_KEYS = ("frames_sha256", "pcm_sha256")
CONDITION_KEYS = ("engine", "weights", "mode", "tier", "steps", "seed", "compile", "layout", "device")
MIN_PREFIX = 8
_HEX = re.compile(r"^[0-9a-f]+$")

IDENTICAL, DIFFERS, NOT_IN_REFERENCE = "identical", "differs", "not in reference"


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


def weights_identity(engine_info: dict[str, Any]) -> str | None:
    """Which weights an embedded run ran, as its manifest's ``engine`` block records them: the
    checkpoint's tree sha256, or ``random`` (also a manifest from before weights were recorded).
    None for an engine whose runs record no weights choice."""

    if not engine_info.get("embedded"):
        return None
    return engine_info.get("weights_sha256") or "random"


def run_conditions(manifest: dict[str, Any]) -> dict[str, Any]:
    request, resolved = manifest["request"], manifest.get("resolved", {})
    return {
        "engine": manifest.get("engine", {}).get("name"),
        "weights": weights_identity(manifest.get("engine", {})),
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
        # the weights' values do not change the work a step does: another checkpoint's ms/step still compares
        reasons = condition_differences({k: v for k, v in conditions.items() if k not in ("layout", "weights")},
                                        actual)
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
