"""Sample sets in Sand AI's published format (``assets/demo_samples.json``), read into requests.

A set is a JSON array of ``{"prompt": ...}`` or ``{"prompt_file": ...}`` entries, with
``"image"`` for I2VA, plus optional ``name``, ``tier``, ``seed``, ``steps`` and ``mode``.
Relative paths resolve against the set's folder, then the set's root; nothing may resolve
outside that root (:func:`magi2studio.vocabulary.paths.contained`). The root is explicit: the set's own
folder unless the user names one (``--root``; Sand AI writes ``assets/...`` from their
repository's top, so their layout needs ``--root REPO``); the bundled copy's root is its
own tree. Every entry is validated, prompt files read and images decoded, before any run
starts; a set of more than :data:`CONFIRM_ENTRIES` entries needs ``confirm_large``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..vocabulary.paths import contained, read_text
from ..vocabulary.request import Request, build_request, read_prompt_file

BUNDLED_DIR = Path(__file__).resolve().parents[1] / "data" / "sandai"
BUNDLED_SET = BUNDLED_DIR / "assets" / "demo_samples.json"
BUNDLED_ALIAS = "sandai"  # what to type instead of the bundled set's path
MAX_SET_BYTES = 1024 * 1024
ENTRY_KEYS = ("prompt", "prompt_file", "image", "name", "tier", "seed", "steps", "mode")
SEED_POLICIES = ("fixed", "offset")
CONFIRM_ENTRIES = 100  # above this many entries a set runs only when confirmed (--yes)


class MissingFile(InputError):
    """An entry names a file that is not there (``skip_missing`` may leave such entries out)."""


@dataclass(frozen=True)
class Sample:
    """One entry of a set, resolved: its name, its validated request and how its seed was chosen."""

    index: int
    name: str
    request: Request
    seed_source: str  # "fixed", "offset" or "entry"
    sources: dict[str, str]  # the entry's paths as written -> resolved absolute paths


@dataclass(frozen=True)
class Skipped:
    """An entry left out because a file it names is missing (only with ``skip_missing``)."""

    index: int
    name: str
    mode: str
    reason: str


@dataclass
class SampleSet:
    path: Path
    root: Path
    seed: int
    seed_policy: str
    samples: list[Sample] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {"path": str(self.path), "root": str(self.root), "seed": self.seed,
                "seed_policy": self.seed_policy, "entries": len(self.samples) + len(self.skipped)}


def resolve_set_path(text: str | Path) -> Path:
    """``sandai`` means the bundled copy of Sand AI's set; anything else is a path."""

    return BUNDLED_SET if str(text) == BUNDLED_ALIAS else Path(text)


def set_root(set_file: Path, root: str | Path | None = None) -> Path:
    """The explicit root: the one named, the bundled tree for the bundled set, else the set's folder."""

    if root is not None:
        folder = Path(root)
        if not folder.is_dir():
            raise InputError("root", f"{root} is not a folder", "name the folder the set's paths are written against")
        return folder.resolve()
    if set_file.resolve() == BUNDLED_SET.resolve():
        return BUNDLED_DIR.resolve()
    return set_file.resolve().parent


def resolve_entry_path(written: str, set_file: Path, root: Path, field_name: str) -> Path:
    """An entry's path: in the set's folder, else in the root; both must stay inside the root."""

    folder = set_file.resolve().parent
    if not folder.is_relative_to(root):
        raise InputError("root", f"the set's folder {folder} is outside the root {root}",
                         "name a root that holds the sample set")
    candidates = [contained(written, root, field_name, base=folder), contained(written, root, field_name)]
    for candidate in candidates:
        if candidate.exists():
            return candidate
    raise MissingFile(field_name, f"{written} does not exist (looked in {folder} and {root})",
                      "add the file, or correct the path")


def load_set_json(set_file: Path) -> list[Any]:
    text = read_text(set_file, "samples", f"a sample set JSON file, or {BUNDLED_ALIAS}", MAX_SET_BYTES)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError("samples", f"{set_file} is not valid JSON (line {err.lineno}: {err.msg})",
                         "fix the JSON syntax") from None
    except RecursionError:
        raise InputError("samples", f"{set_file} nests too deeply", "write a flat array of entries") from None
    if not isinstance(data, list):
        raise InputError("samples", f"{set_file} holds a JSON {type(data).__name__}, not an array",
                         'write a JSON array of {"prompt_file": ...} entries, as Sand AI\'s demo_samples.json')
    if not data:
        raise InputError("samples", f"{set_file} is an empty array", "add at least one entry")
    return data


def default_name(entry: dict[str, Any], index: int, mode: str) -> str:
    """``sample_000-i2va`` from the prompt file's stem and the mode; ``entry-3-t2va`` for inline prompts."""

    stem = Path(entry["prompt_file"]).stem if entry.get("prompt_file") else f"entry-{index}"
    return f"{stem}-{mode}"


def read_entry(entry: Any, index: int, set_file: Path, root: Path, seed: int, seed_policy: str,
               defaults: dict[str, Any]) -> Sample:
    where = f"samples[{index}]"
    if not isinstance(entry, dict):
        raise InputError(where, f"is a JSON {type(entry).__name__}, not an object",
                         'write each entry as {"prompt_file": ...} or {"prompt": ...}')
    unknown = sorted(set(entry) - set(ENTRY_KEYS))
    if unknown:
        raise InputError(f"{where}.{unknown[0]}", "is not a sample entry key", f"use only {', '.join(ENTRY_KEYS)}")
    has_prompt, has_file = bool(entry.get("prompt")), bool(entry.get("prompt_file"))
    if has_prompt == has_file:
        problem = "has both prompt and prompt_file" if has_prompt else "has neither prompt nor prompt_file"
        raise InputError(where, problem, "give exactly one of prompt or prompt_file")
    sources: dict[str, str] = {}
    if has_file:
        prompt_path = resolve_entry_path(entry["prompt_file"], set_file, root, f"{where}.prompt_file")
        try:
            prompt = read_prompt_file(prompt_path)
        except InputError as err:
            raise InputError(f"{where}.prompt_file", err.problem, err.fix) from None
        sources[entry["prompt_file"]] = str(prompt_path)
    else:
        if not isinstance(entry["prompt"], str):
            raise InputError(f"{where}.prompt", "must be text", "write the prompt as a JSON string")
        prompt = entry["prompt"].strip()
    image = None
    if entry.get("image") is not None:
        image_path = resolve_entry_path(entry["image"], set_file, root, f"{where}.image")
        image = str(image_path)
        sources[entry["image"]] = image
    mode = entry.get("mode", "i2va" if image else "t2va")
    if "seed" in entry:
        chosen_seed, seed_source = entry["seed"], "entry"
    else:
        chosen_seed = seed + index if seed_policy == "offset" else seed
        seed_source = seed_policy
    fields = {**defaults, "mode": mode, "prompt": prompt, "image": image, "seed": chosen_seed,
              "prompt_file": str(sources.get(entry.get("prompt_file"), "")) or None}
    for key in ("tier", "steps"):
        if key in entry:
            fields[key] = entry[key]
    try:
        request = build_request(**fields)
    except InputError as err:
        raise InputError(f"{where}.{err.field}", err.problem, err.fix) from None
    name = entry.get("name", default_name(entry, index, request.mode))
    if not isinstance(name, str) or not name.strip() or "/" in name or name.startswith("."):
        raise InputError(f"{where}.name", f"{name!r} is not a usable sample name",
                         "use a short name without slashes, e.g. sample_000-i2va")
    return Sample(index, name, request, seed_source, sources)


def load_sample_set(path: str | Path, *, seed: int = 42, seed_policy: str = "fixed",
                    defaults: dict[str, Any] | None = None, skip_missing: bool = False,
                    root: str | Path | None = None, confirm_large: bool = False) -> SampleSet:
    """Read and validate a whole set; raise InputError for the first bad entry.

    ``defaults`` are request fields (tier, steps, ...) an entry's own keys override.
    ``skip_missing`` leaves out entries whose prompt file or image does not exist (recorded
    in ``skipped``) instead of refusing the set: Sand AI's set lists
    ``assets/sample_enhanced_t2v.json``, which they have not published. ``root`` is the
    folder every path must stay inside (default: see :func:`set_root`).
    """

    if seed_policy not in SEED_POLICIES:
        raise InputError("seed_policy", f"unknown policy {seed_policy!r}",
                         "use fixed (every entry the same seed, as the blog) or offset (seed + index, as entry.py)")
    set_file = resolve_set_path(path)
    entries = load_set_json(set_file)
    if len(entries) > CONFIRM_ENTRIES and not confirm_large:
        raise InputError("samples", f"{set_file} has {len(entries)} entries (more than {CONFIRM_ENTRIES})",
                         "pass --yes to run them all, or split the set")
    result = SampleSet(set_file.resolve(), set_root(set_file, root), seed, seed_policy)
    for index, entry in enumerate(entries):
        try:
            sample = read_entry(entry, index, set_file, result.root, seed, seed_policy, dict(defaults or {}))
        except MissingFile as err:
            if not skip_missing:
                raise InputError(err.field, err.problem, f"{err.fix}, or pass --skip-missing to run the rest") from None
            mode = entry.get("mode", "i2va" if entry.get("image") else "t2va")
            name = str(entry.get("name") or default_name(entry, index, mode))
            result.skipped.append(Skipped(index, name, mode, str(err)))
            continue
        result.samples.append(sample)
    names = [s.name for s in result.samples] + [s.name for s in result.skipped]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate:
        raise InputError("samples", f"two entries are both named {duplicate!r}", "give one of them a distinct name")
    if not result.samples:
        raise InputError("samples", "no entry can run", "add the missing files")
    return result
