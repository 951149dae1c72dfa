"""Hypothesis strategies and one-input attempts for the bad-input fuzz (issue 19).

Each ``attempt_*`` feeds one drawn input through a real entry point and returns its outcome:
``accepted`` (it would run), ``refused`` (one ``<field>: <problem>. Fix: <fix>`` line),
``traceback`` (any other exception, or an ``internal error`` line) or ``leftover`` (a file
appeared where none may). tests/requests_and_runs/test_fuzz_inputs.py asserts the last two never happen;
scripts/fuzz_counts.py counts all four.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
from pathlib import Path

from hypothesis import strategies as st

from magi2studio.run_folder import runs
from magi2studio.cli import main
from magi2studio.errors import InputError
from magi2studio.vocabulary.request import Request, build_request
from magi2studio.reproduction.samples import ENTRY_KEYS, load_sample_set

ONE_LINE = re.compile(r"^[^\n]+: [^\n]+\. Fix: [^\n]+$")
ERROR_LINE = re.compile(r"^error: [^\n]+: [^\n]+\. Fix: [^\n]+$")

junk = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)
paths = st.one_of(
    st.sampled_from(["p.txt", "img.png", "../p.txt", "../../etc/passwd", "/etc/passwd", "sub/../p.txt", "link.txt",
                     "loop", "fifo", "dir", "", " ", "nope.txt", "p.txt\x00x", "./p.txt", "../" * 12 + "etc/hostname"]),
    st.text(max_size=30),
)
field_values = {
    "mode": st.one_of(st.sampled_from(["t2va", "i2va", "T2VA", ""]), junk),
    "prompt": st.one_of(st.text(max_size=60), st.just(" " * 5), st.just("x" * 200_001), junk),
    "prompt_file": st.one_of(paths, junk),
    "image": st.one_of(paths, junk),
    "negative_prompt": st.one_of(st.text(max_size=40), st.just("n" * 200_001), junk),
    "seed": st.one_of(st.integers(min_value=-2**70, max_value=2**70), junk),
    "tier": st.one_of(st.sampled_from(["272p", "540p", "1080p", "720p", "272P"]), junk),
    "steps": st.one_of(st.integers(min_value=-5, max_value=2000), junk),
    "refiner_steps": st.one_of(st.integers(min_value=-5, max_value=100), junk),
    "video_cfg": st.one_of(st.floats(), junk),
    "audio_cfg": st.one_of(st.floats(), junk),
    "compile": st.one_of(st.sampled_from(["static", "dynamic", "eager", "jit"]), junk),
    "deterministic": st.one_of(st.booleans(), junk),
    "output_width": st.one_of(st.sampled_from([448, 1920, 0, -1]), junk),
    "output_height": st.one_of(st.sampled_from([256, 1080, 1088, 0]), junk),
}
request_fields = st.fixed_dictionaries(
    {"prompt": st.one_of(st.just("a red kite over a windy beach"), field_values["prompt"])},
    optional={**{k: v for k, v in field_values.items() if k != "prompt"}, "bogus": junk},
)
entry_values = {**{k: field_values[k] for k in ("prompt", "prompt_file", "image", "tier", "seed", "steps", "mode")},
                "name": st.one_of(st.text(max_size=12), st.sampled_from(["../up", ".hidden", "a/b"]), junk)}
entries = st.one_of(
    st.fixed_dictionaries({}, optional={**{k: entry_values[k] for k in ENTRY_KEYS}, "extra": junk}),
    junk,
)
sample_sets = st.one_of(st.lists(entries, max_size=4), junk, st.text(max_size=30).map(lambda t: ("raw", t)))


def classify(call) -> str:
    try:
        call()
    except InputError as err:
        return "refused" if ONE_LINE.match(str(err)) else "traceback"
    except Exception:  # anything else is a traceback the user would see
        return "traceback"
    return "accepted"


def attempt_request(fields: dict) -> str:
    return classify(lambda: build_request(**fields))


def attempt_request_yaml(text: str, folder: Path) -> str:
    return classify(lambda: Request.from_yaml(text, root=folder))


def make_set_folder(root: Path) -> Path:
    """A folder with the files the drawn paths may name: a prompt, a symlink out, a fifo, a dir."""
    folder = root / "set"
    (folder / "sub").mkdir(parents=True)
    (folder / "dir").mkdir()
    (folder / "p.txt").write_text("a clay teapot on a wooden table", encoding="utf-8")
    (root / "p.txt").write_text("outside the set's folder", encoding="utf-8")
    (folder / "link.txt").symlink_to(root / "p.txt")
    (folder / "loop").symlink_to(folder / "loop")
    os.mkfifo(folder / "fifo")
    return folder


def snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def attempt_sample_set(data, folder: Path) -> str:
    set_file = folder / "s.json"
    if isinstance(data, tuple):
        set_file.write_text(data[1], encoding="utf-8")
    else:
        set_file.write_text(json.dumps(data), encoding="utf-8")
    before = snapshot(folder.parent)

    def load():
        loaded = load_sample_set(set_file)
        for sample in loaded.samples:  # nothing read from outside the set's folder
            for resolved in sample.sources.values():
                assert Path(resolved).resolve().is_relative_to(folder.resolve()), resolved

    outcome = classify(load)
    set_file.unlink()
    return "leftover" if snapshot(folder.parent) != before - {"set/s.json"} else outcome


def run_cli(argv: list[str]) -> tuple[int, str]:
    """(exit status, stderr); an exception escaping main() is a traceback the user would see."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except (Exception, SystemExit) as escaped:  # noqa: BLE001 - recorded as what the user would see
            return 1, f"Traceback (most recent call last):\n{type(escaped).__name__}: {escaped}"
    return code, err.getvalue()


def attempt_cli(argv: list[str], out: Path) -> str:
    """``generate`` with drawn flags and an unknown engine: it stops at the validation door."""
    code, err = run_cli(["generate", *argv, "--engine", "no-such-engine", "--out", str(out)])
    if out.exists():
        return "leftover"
    lines = [line for line in err.splitlines() if line.strip()]
    return "refused" if code == 2 and len(lines) == 1 and ERROR_LINE.match(lines[0]) else "traceback"


cli_argv = st.lists(st.tuples(st.sampled_from(["--prompt", "--prompt-file", "--image", "--negative-prompt", "--tier",
                                               "--seed", "--steps", "--refiner-steps", "--output-width", "--request",
                                               "--layout"]),
                              st.one_of(paths, st.text(max_size=20).filter(lambda t: not t.startswith("-")))),
                    max_size=4).map(lambda pairs: [x for pair in pairs for x in pair])


def mutate_manifest(manifest: dict, path: list, value) -> dict:
    """``manifest`` with the value at ``path`` (keys, clipped to what exists) replaced."""
    copy = json.loads(json.dumps(manifest))
    node = copy
    for key in path[:-1]:
        if isinstance(node, dict) and key in node and isinstance(node[key], dict):
            node = node[key]
        else:
            break
    node[path[-1] if path else "request"] = value
    return copy


manifest_edits = st.one_of(
    st.tuples(st.just("bytes"), st.binary(max_size=64)),
    st.tuples(st.just("cut"), st.integers(min_value=0, max_value=4000)),
    st.tuples(st.just("field"), st.lists(st.sampled_from(["request", "seed", "prompt", "tier", "steps", "hashes",
                                                           "frames_sha256", "layout", "name", "engine", "files",
                                                           "video.mp4", "resolved", "manifest_version", "image"]),
                                          min_size=1, max_size=3), junk),
)


def attempt_manifest(folder: Path, pristine: bytes, edit) -> str:
    manifest = folder / "manifest.json"
    kind, *rest = edit
    if kind == "bytes":
        manifest.write_bytes(rest[0])
    elif kind == "cut":
        manifest.write_bytes(pristine[: rest[0]])
    else:
        manifest.write_text(json.dumps(mutate_manifest(json.loads(pristine), *rest)), encoding="utf-8")
    before = snapshot(folder.parent)
    code, err = run_cli(["verify", str(folder)])
    manifest.write_bytes(pristine)
    if snapshot(folder.parent) != before:
        return "leftover"
    lines = [line for line in err.splitlines() if line.strip()]
    if code == 0 and not lines:
        return "accepted"
    return "refused" if code == 2 and len(lines) == 1 and ERROR_LINE.match(lines[0]) else "traceback"


def made_before_run_ids(folder: Path, into: Path) -> Path:
    """A copy of ``folder`` as magi2studio wrote run folders before their run id was the manifest's
    digest: no ``run_id`` key in manifest.json and a random 6-hex id in the name. Its manifest's fields
    are checked by their own rules only, which is what the manifest fuzz exercises."""
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    del manifest[runs.RUN_ID_KEY]
    copy = into / f"{folder.name.rsplit('-', 1)[0]}-d8495a"
    shutil.copytree(folder, copy)
    (copy / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    return copy


def fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path
