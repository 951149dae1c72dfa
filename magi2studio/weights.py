"""Checks a MAGI-2 Preview checkpoint tree before an engine spends minutes loading it.

The tree is the Hugging Face layout of ``sand-ai/MAGI-2-preview``. The files each tier
needs come from vLLM-Omni's own list (``pipeline_magi2._REQUIRED_CHECKPOINT_PATHS``) plus
``refiner/`` for 1080p (Sand AI's ``magi2_refiner.json``: ``magi2_refiner_model_path``).
Every problem is named file by file, so a partial download says what to fetch again.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .errors import InputError
from .vocabulary.tiers import get_tier

DEFAULT_ROOT = Path("models/MAGI-2-preview")
REFINER_DIR = "refiner"
# huggingface_hub's local-dir downloads record (commit, etag, timestamp) per file here; the
# etag of a Git LFS file is its sha256, of a small file its git blob sha1.
HF_METADATA_DIR = Path(".cache") / "huggingface" / "download"
SHA256SUMS = "SHA256SUMS"
_MAX_HEADER = 100 * 1024 * 1024
_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}


def upstream_required_paths() -> tuple[str, ...]:
    """vLLM-Omni 0.30.0's list of files the MAGI-2 pipeline refuses to start without."""

    from vllm_omni.diffusion.models.magi2.pipeline_magi2 import _REQUIRED_CHECKPOINT_PATHS

    return tuple(_REQUIRED_CHECKPOINT_PATHS)


def resolve_root(root: str | os.PathLike | None) -> Path:
    """``--root``, else ``MAGI2_CKPT_ROOT``, else ``./models/MAGI-2-preview``."""

    return Path(root or os.environ.get("MAGI2_CKPT_ROOT") or DEFAULT_ROOT)


@dataclass
class WeightsReport:
    root: Path
    tier: str
    files_checked: int = 0
    problems: list[tuple[str, str]] = field(default_factory=list)  # (relative path, problem)
    hashed: int = 0
    unverified: list[str] = field(default_factory=list)  # hashed, but no recorded hash to compare
    revisions: set[str] = field(default_factory=set)  # commits the files were downloaded from

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, path: str, problem: str) -> None:
        self.problems.append((path, problem))

    def lines(self) -> list[str]:
        head = "ok" if self.ok else f"{len(self.problems)} problem(s)"
        out = [f"weights {self.root} for {self.tier}: {head} ({self.files_checked} files checked)"]
        out += [f"  {path}: {problem}" for path, problem in self.problems]
        if self.revisions:
            out.append(f"  downloaded from revision {', '.join(sorted(self.revisions))}")
        if self.hashed:
            out.append(f"  sha256: {self.hashed - len(self.unverified)} of {self.hashed} files matched a recorded hash")
            out += [f"  {path}: no recorded hash to compare" for path in self.unverified]
        return out

    def as_dict(self) -> dict:
        return {"root": str(self.root), "tier": self.tier, "ok": self.ok, "files_checked": self.files_checked,
                "problems": [{"path": p, "problem": m} for p, m in self.problems],
                "revisions": sorted(self.revisions), "hashed": self.hashed, "unverified": self.unverified}


def check_weights(root: str | os.PathLike | None = None, tier: str = "272p", *, hash_files: bool = False,
                  progress: bool = False) -> WeightsReport:
    """Check the tree for ``tier``; raise InputError only when there is no folder at all."""

    tier_obj = get_tier(tier)
    folder = resolve_root(root)
    if not folder.is_dir():
        raise InputError("weights root", f"{folder} is not a folder",
                         "download sand-ai/MAGI-2-preview there (docs/container.md), "
                         "or pass --root / set MAGI2_CKPT_ROOT")
    report = WeightsReport(folder, tier_obj.name)
    if not any(_tree_files(folder)):
        report.add(".", "the folder is empty: download sand-ai/MAGI-2-preview into it (docs/container.md)")
        return report
    for relative in upstream_required_paths():
        if not (folder / relative).is_file():
            report.add(relative, "missing (vLLM-Omni's MAGI-2 pipeline requires it)")
    if tier_obj.refined:
        refiner = folder / REFINER_DIR
        if not refiner.is_dir() or not any(refiner.glob("*.safetensors*")):
            report.add(f"{REFINER_DIR}/", "missing: the 1080p tier runs Sand AI's refiner checkpoint from here")
    _check_files(folder, report)
    _read_revisions(folder, report)
    if hash_files:
        _hash_files(folder, report, progress)
    return report


def _tree_files(folder: Path) -> Iterator[Path]:
    for path in sorted(folder.rglob("*")):
        if path.is_file() and ".cache" not in path.relative_to(folder).parts:
            yield path


def _check_files(folder: Path, report: WeightsReport) -> None:
    covered: set[Path] = set()
    for index in sorted(folder.rglob("*.safetensors.index.json")):
        report.files_checked += 1
        covered |= _check_index(folder, index, report)
    for path in _tree_files(folder):
        if path in covered or path.name.endswith(".safetensors.index.json"):
            continue
        relative = path.relative_to(folder).as_posix()
        if _unreadable(path, relative, report):
            continue
        if path.suffix == ".safetensors":
            report.files_checked += 1
            _check_safetensors(path, relative, report)
        elif path.suffix in (".pth", ".ckpt", ".pt", ".bin"):
            report.files_checked += 1
            _check_torch_file(path, relative, report)
        elif path.suffix == ".json":
            report.files_checked += 1
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError) as err:
                report.add(relative, f"not valid JSON ({err})")


def _check_index(folder: Path, index: Path, report: WeightsReport) -> set[Path]:
    """Every shard the index names exists, parses, and holds the tensors mapped to it."""

    relative = index.relative_to(folder).as_posix()
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
        weight_map = data["weight_map"]
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError("weight_map is empty")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
        report.add(relative, f"corrupt index ({err.__class__.__name__}: {err}); download it again")
        return set()
    by_shard: dict[str, list[str]] = {}
    for tensor, shard in weight_map.items():
        by_shard.setdefault(str(shard), []).append(tensor)
    covered: set[Path] = set()
    for shard, tensors in sorted(by_shard.items()):
        path = index.parent / shard
        shard_rel = path.relative_to(folder).as_posix()
        covered.add(path)
        report.files_checked += 1
        header = None
        if not path.is_file():
            report.add(shard_rel, f"missing ({len(tensors)} tensors of {relative} live there)")
        elif _unreadable(path, shard_rel, report):
            continue
        else:
            header = _check_safetensors(path, shard_rel, report)
        if header is None:
            continue
        absent = [t for t in tensors if t not in header]
        if absent:
            report.add(shard_rel, f"lacks {len(absent)} tensor(s) the index maps to it, e.g. {absent[0]}")
    return covered


def _unreadable(path: Path, relative: str, report: WeightsReport) -> bool:
    """A file this user cannot read (the image runs as uid 10001; safetensors writes 0600 files)."""
    if os.access(path, os.R_OK):
        return False
    report.add(relative, f"not readable by uid {os.getuid()}: make the weights readable to all "
                         "(chmod -R a+rX on the weights folder; the image runs as uid 10001)")
    return True


def _span(entry: dict) -> int:
    start, end = entry["data_offsets"]
    return end - start


def _check_safetensors(path: Path, relative: str, report: WeightsReport) -> dict | None:
    """Parse the header and compare the file's size with what the header says it holds."""

    size = path.stat().st_size
    try:
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                report.add(relative, f"truncated: {size} bytes, not even a safetensors header")
                return None
            (length,) = struct.unpack("<Q", prefix)
            if length > _MAX_HEADER or 8 + length > size:
                report.add(relative, f"truncated or not safetensors: header claims {length} bytes, file has {size}")
                return None
            header = json.loads(handle.read(length))
    except (OSError, ValueError) as err:
        report.add(relative, f"unreadable safetensors header ({err})")
        return None
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    try:
        data_end = max((v["data_offsets"][1] for v in tensors.values()), default=0)
        for name, entry in tensors.items():
            want = math.prod(entry["shape"]) * _DTYPE_BYTES.get(entry["dtype"], 0)
            if _DTYPE_BYTES.get(entry["dtype"]) and want != _span(entry):
                report.add(relative, f"tensor {name}: header offsets span {_span(entry)} bytes, shape needs {want}")
                return None
    except (KeyError, TypeError, ValueError, IndexError) as err:
        report.add(relative, f"malformed safetensors header ({err.__class__.__name__}: {err})")
        return None
    expected = 8 + length + data_end
    if size < expected:
        report.add(relative, f"truncated: {size} bytes, its header says {expected}; download it again")
        return None
    if size > expected:
        report.add(relative, f"{size} bytes, its header says {expected}: trailing data, download it again")
        return None
    return tensors


def _check_torch_file(path: Path, relative: str, report: WeightsReport) -> None:
    """torch.save files are zip archives (or legacy pickles); a truncated zip has no directory."""

    with path.open("rb") as handle:
        magic = handle.read(2)
    if magic == b"PK":
        try:
            with zipfile.ZipFile(path) as archive:
                archive.namelist()
        except (zipfile.BadZipFile, OSError) as err:
            report.add(relative, f"truncated or corrupt torch checkpoint ({err}); download it again")
    elif magic[:1] != b"\x80":
        report.add(relative, f"not a torch checkpoint ({path.stat().st_size} bytes, no zip or pickle header)")


def _recorded_hashes(folder: Path) -> dict[str, str]:
    """Hashes a download recorded: a SHA256SUMS file, else huggingface_hub's metadata."""

    recorded: dict[str, str] = {}
    sums = folder / SHA256SUMS
    if sums.is_file():
        for line in sums.read_text(encoding="utf-8").splitlines():
            digest, _, name = line.strip().partition("  ")
            if digest and name:
                recorded[name.lstrip("*").removeprefix("./")] = digest.lower()
    meta_root = folder / HF_METADATA_DIR
    if meta_root.is_dir():
        for meta in meta_root.rglob("*.metadata"):
            lines = meta.read_text(encoding="utf-8").splitlines()
            name = meta.relative_to(meta_root).as_posix().removesuffix(".metadata")
            if len(lines) >= 2 and name not in recorded:
                recorded[name] = lines[1].strip().strip('"').lower()
    return recorded


def _read_revisions(folder: Path, report: WeightsReport) -> None:
    meta_root = folder / HF_METADATA_DIR
    if meta_root.is_dir():
        for meta in meta_root.rglob("*.metadata"):
            first = meta.read_text(encoding="utf-8").splitlines()[:1]
            if first and first[0].strip():
                report.revisions.add(first[0].strip())


def _hash_files(folder: Path, report: WeightsReport, progress: bool) -> None:
    from tqdm import tqdm

    recorded = _recorded_hashes(folder)
    files = [p for p in _tree_files(folder) if p.name != SHA256SUMS]
    total = sum(p.stat().st_size for p in files)
    with tqdm(total=total, unit="B", unit_scale=True, desc="sha256", disable=not progress) as bar:
        for path in files:
            relative = path.relative_to(folder).as_posix()
            want = recorded.get(relative)
            sha256, sha1 = hashlib.sha256(), hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
            with path.open("rb") as handle:
                for chunk in iter(lambda: handle.read(8 << 20), b""):
                    sha256.update(chunk)
                    sha1.update(chunk)
                    bar.update(len(chunk))
            report.hashed += 1
            if want is None:
                report.unverified.append(relative)
            elif want not in (sha256.hexdigest(), sha1.hexdigest()):
                report.add(relative, f"sha256 {sha256.hexdigest()} does not match the recorded {want}")
