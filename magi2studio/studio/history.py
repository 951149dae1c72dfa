"""What the History tab lists, searches and deletes: the run folders under the outputs root.

A run folder is the record (its manifest says prompt, seed, tier, layout, date and hashes), so
nothing else is stored. Deleting takes only a complete run folder directly under the outputs
root: it is renamed to a hidden name first (History and the CLI skip hidden folders), then
removed, so no half-deleted run is ever listed.
"""

from __future__ import annotations

import shutil
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import InputError
from ..vocabulary.request import RANDOM_SEED
from ..run_folder.runs import is_complete, load_run

MAX_SHOWN = 200
PROMPT_PREVIEW_CHARS = 160
CAPTION_PROMPT_CHARS = 48  # of the prompt on a History card (the details show all of it)


@dataclass(frozen=True)
class RunEntry:
    """One run folder as History shows it; ``identical_to`` names an older run with the same output hashes."""

    path: Path
    created: str
    mode: str
    tier: str
    seed: int
    seed_drawn: bool
    layout: str
    steps: int | None
    prompt: str
    frames_sha256: str
    pcm_sha256: str
    identical_to: str | None = None

    @property
    def name(self) -> str:
        return self.path.name

    def caption(self) -> str:
        """Seed first (a cut caption keeps it), then tier, layout and the date; the mode and the prompt's start on
        the next line (a T2VA and an I2VA run of one seed must not look alike); the badge on its own line."""
        badge = f"\n= identical to {self.identical_to}" if self.identical_to else ""
        prompt = " ".join(self.prompt.split())
        if len(prompt) > CAPTION_PROMPT_CHARS:
            prompt = prompt[:CAPTION_PROMPT_CHARS].rstrip() + "…"
        return (f"seed {self.seed} · {self.tier} · {self.layout} · {self.created[:16].replace('T', ' ')}\n"
                f"{self.mode.upper()} · {prompt}{badge}")

    def haystack(self) -> str:
        return " ".join((self.name, self.created.replace("T", " "), self.mode, self.tier, f"seed {self.seed}",
                         str(self.seed), self.layout, self.prompt)).lower()


def _entry(path: Path) -> RunEntry | None:
    try:
        manifest = load_run(path).manifest
        request, hashes = manifest["request"], manifest["hashes"]
        return RunEntry(path=path, created=str(manifest.get("created", "")), mode=str(request.get("mode", "")),
                        tier=str(request.get("tier", "")), seed=int(request.get("seed", 0)),
                        seed_drawn=manifest["resolved"].get("seed_asked") == RANDOM_SEED,
                        layout=manifest["layout"]["name"], steps=manifest["resolved"].get("steps"),
                        prompt=str(request.get("prompt", "")), frames_sha256=hashes["frames_sha256"],
                        pcm_sha256=hashes["pcm_sha256"])
    except (InputError, KeyError, TypeError, ValueError):
        return None  # unreadable or not ours: History lists run folders, nothing else


def list_entries(outputs_root: Path) -> list[RunEntry]:
    """Complete run folders under the outputs root, newest first, each marked with an older identical twin."""
    root = Path(outputs_root)
    if not root.is_dir():
        return []
    folders = [p for p in root.iterdir() if not p.name.startswith(".") and not p.is_symlink() and is_complete(p)]
    folders.sort(key=lambda p: (p.stat().st_mtime, p.name), reverse=True)
    entries = [entry for entry in map(_entry, folders[:MAX_SHOWN]) if entry is not None]
    first_of: dict[tuple[str, str], str] = {}
    for entry in reversed(entries):  # oldest first: a run is identical to the first run that had its hashes
        first_of.setdefault((entry.frames_sha256, entry.pcm_sha256), entry.name)
    twins = [first_of[(entry.frames_sha256, entry.pcm_sha256)] for entry in entries]
    return [entry if twin == entry.name else replace(entry, identical_to=twin) for entry, twin in zip(entries, twins)]


def search(entries: list[RunEntry], query: str | None) -> list[RunEntry]:
    """Entries whose prompt, seed, tier, layout, mode, date or name hold every word of ``query``."""
    words = (query or "").lower().split()
    return [entry for entry in entries if all(word in entry.haystack() for word in words)]


def details(entry: RunEntry) -> str:
    """The picked run in Markdown: what it is, its full prompt (cut), and the identical-twin badge."""
    prompt = entry.prompt if len(entry.prompt) <= PROMPT_PREVIEW_CHARS else entry.prompt[:PROMPT_PREVIEW_CHARS] + "…"
    drawn = " (drawn at random)" if entry.seed_drawn else ""
    badge = (f"\n\n**= identical to run {entry.identical_to}** (same frame and audio hashes)"
             if entry.identical_to else "")
    return (f"**{entry.name}** · {entry.mode.upper()} {entry.tier} · seed **{entry.seed}**{drawn} · "
            f"{entry.steps} steps · layout {entry.layout} · {entry.created}\n\n> {prompt}{badge}")


# The last deleted run folder waits here, hidden (History lists, and the studio serves, no hidden folder), so
# its delete can be undone until the next delete or the studio's exit.
DELETED = ".deleted"


def delete_run(outputs_root: Path, path: str | Path) -> str:
    """Delete one run folder, undoably (:func:`undo_delete`): it goes into the outputs root's hidden
    ``.deleted`` folder, which keeps only the last one deleted. Refuse anything that is not a complete run
    folder directly under the outputs root."""
    root = Path(outputs_root).resolve()
    folder = Path(path)
    fix = "pick a run in History (only run folders under the outputs root are deleted)"
    if folder.is_symlink() or folder.resolve().parent != root or folder.name.startswith("."):
        raise InputError("run", f"{folder} is not a run folder under {root}", fix)
    folder = folder.resolve()
    if _entry(folder) is None:
        raise InputError("run", f"{folder.name} is not a complete run folder (no readable manifest)", fix)
    forget_deleted(root)
    (root / DELETED).mkdir()
    folder.rename(root / DELETED / folder.name)
    return folder.name


def undo_delete(outputs_root: Path, name: str) -> str:
    """Put the last deleted run folder back where it was."""
    root = Path(outputs_root).resolve()
    kept = root / DELETED / Path(name or "").name
    if not name or not kept.is_dir():
        raise InputError("run", f"{name or 'that run'} is no longer kept to be restored (only the last delete can "
                                "be undone, until the next delete or the studio's exit)", "press Refresh")
    if (root / kept.name).exists():
        raise InputError("run", f"{kept.name} exists again under {root}", "press Refresh")
    kept.rename(root / kept.name)
    forget_deleted(root)
    return kept.name


def forget_deleted(outputs_root: Path) -> None:
    """Remove the kept deleted run for good (renamed first, so a half-removed folder is never kept)."""
    kept = Path(outputs_root) / DELETED
    if kept.is_dir():
        going = kept.with_name(f".deleting-{uuid.uuid4().hex[:6]}")
        kept.rename(going)
        shutil.rmtree(going)
