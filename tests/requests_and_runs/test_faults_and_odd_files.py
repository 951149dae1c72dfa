"""Faults and odd files end in one line naming the problem and the fix, and leave nothing behind.

replay/verify of a malformed or tampered run folder (an edited manifest is named by the run id,
which is its digest, without a re-run; a folder made before that is read as not covered), a write
refused by the OS (RLIMIT_FSIZE: the path a full disk takes; an --out this user cannot write), SIGTERM
while a run folder is written, prompt and request files that are folders, fifos, devices or not
UTF-8, a layout refusal in an empty folder, and scripts/fuzz_counts.py leaving nothing in TMPDIR.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from magi2studio import media
from magi2studio.run_folder import runs
from magi2studio.run_folder.atomic import write_atomic
from magi2studio.cli import main
from magi2studio.engines.base import Generation, Plan
from magi2studio.errors import describe_os_error
from magi2studio.vocabulary.layouts import parse_layout
from magi2studio.vocabulary.request import build_request
from magi2studio.vocabulary.tiers import get_tier

from .conftest import SAMPLES
from .fuzzing import made_before_run_ids

ROOT = Path(__file__).resolve().parents[2]

PROMPT = "a red kite over a windy beach, waves and gulls"


def one_clean_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "Fix: " in lines[0], err
    return lines[0]


def hidden_leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*")] if root.exists() else []


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    assert main(["generate", "--prompt", PROMPT, "--steps", "2", "--out", str(out)]) == 0
    (folder,) = [p for p in out.iterdir() if runs.is_complete(p)]
    return folder


@pytest.fixture
def copy_of(run_folder, tmp_path) -> Path:
    target = tmp_path / run_folder.name
    shutil.copytree(run_folder, target)
    return target


@pytest.fixture
def older_copy(run_folder, tmp_path) -> Path:
    return made_before_run_ids(run_folder, tmp_path)


def test_verify_passes_an_intact_folder_and_says_what_it_recomputed(run_folder, capsys):
    assert main(["verify", str(run_folder)]) == 0
    out = capsys.readouterr().out
    assert "5 files match their sha256, recomputed: request.yaml, steps.jsonl, video.mp4, audio.wav, poster.jpg" in out
    assert f"manifest.json: its sha256 starts with the run id in the folder's name ({run_folder.name[-16:]})" in out
    assert "only replay can check hashes.frames_sha256 and hashes.pcm_sha256" in out


def test_the_run_id_is_the_manifests_sha256(run_folder):
    manifest = run_folder / "manifest.json"
    assert run_folder.name.endswith("-" + media.file_sha256(manifest)[:16])
    assert json.loads(manifest.read_text())["run_id"] == runs.RUN_ID_RULE


def _edit(folder: Path, change) -> None:
    manifest = folder / "manifest.json"
    data = json.loads(manifest.read_text(encoding="utf-8"))
    change(data)
    manifest.write_text(json.dumps(data, indent=2), encoding="utf-8")


@pytest.mark.parametrize("change", [
    lambda m: m["hashes"].update(frames_sha256="0" * 64),
    lambda m: m["hashes"].update(pcm_sha256="f" * 64),
    lambda m: m["request"].update(prompt="something else entirely"),
    lambda m: m["engine"].update(weights="trained"),
    lambda m: m["timing"]["stage_ms"].update(preview=1.0),
], ids=["frames_sha256", "pcm_sha256", "request", "engine", "timing"])
def test_an_edited_manifest_field_is_named_as_tampering_before_any_replay(copy_of, capsys, monkeypatch, change):
    """The issue-32 case: a changed hashes.frames_sha256 passed verify and cost replay a full re-run."""
    reruns = []
    monkeypatch.setattr(runs, "execute", lambda *a, **k: reruns.append(a))
    _edit(copy_of, change)
    for command in ("verify", "replay"):
        assert main([command, str(copy_of)]) == 2
        captured = capsys.readouterr()
        line = one_clean_line(captured.err)
        assert "was tampered with: manifest.json was edited after the run" in line
        assert f"the run id in the folder's name is {copy_of.name[-16:]}" in line
        assert "match" not in captured.out
    assert reruns == []


def test_a_renamed_folder_is_named_and_its_own_name_given_back(copy_of, capsys):
    renamed = copy_of.with_name("my-best-run")
    copy_of.rename(renamed)
    assert main(["verify", str(renamed)]) == 2
    line = one_clean_line(capsys.readouterr().err)
    assert "was renamed or tampered with" in line and f"give it back its name ending -{copy_of.name[-16:]}" in line
    renamed.rename(copy_of)
    assert main(["verify", str(copy_of)]) == 0


def test_a_folder_made_before_run_ids_is_read_as_not_covered(older_copy, capsys, monkeypatch):
    assert main(["verify", str(older_copy)]) == 0
    out = capsys.readouterr().out
    assert "manifest.json: not covered (made before run ids were the manifest's sha256)" in out
    assert "5 files match their sha256" in out
    reruns = []
    monkeypatch.setattr(runs, "execute", lambda *a, **k: reruns.append(a) or (_ for _ in ()).throw(KeyboardInterrupt))
    assert main(["replay", str(older_copy)]) == 130  # the note comes before the re-run, which is stopped here
    assert "manifest.json is not covered (made before run ids were its sha256)" in capsys.readouterr().err
    assert len(reruns) == 1


@pytest.mark.parametrize("content, words", [
    (lambda text: text[: len(text) // 2], "not valid JSON"),
    (lambda text: "", "not valid JSON"),
    (lambda text: b"\xff\xfe\x00garbage", "not UTF-8"),
    (lambda text: "[]", "holds a JSON list, not an object"),
    (lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "request"}),
     "manifest.request: is missing"),
    (lambda text: json.dumps({**json.loads(text), "request": {**json.loads(text)["request"], "seed": -1}}),
     "manifest.request.seed: -1 is out of range"),
    (lambda text: json.dumps({**json.loads(text), "request": {**json.loads(text)["request"], "tier": "9000p"}}),
     "manifest.request.tier"),
    (lambda text: json.dumps({**json.loads(text), "layout": {"name": "sp3-cfg9"}}), "layout"),
])
@pytest.mark.parametrize("command", ["verify", "replay"])
def test_a_malformed_manifest_is_one_clean_line_exit_2(copy_of, older_copy, capsys, command, content, words):
    """A current folder names any change as an edit; an older one, with nothing to check it against, names the field."""
    for folder, expected in ((copy_of, "manifest.json was edited after the run"), (older_copy, words)):
        manifest = folder / "manifest.json"
        new = content(manifest.read_text(encoding="utf-8"))
        manifest.write_bytes(new if isinstance(new, bytes) else new.encode("utf-8"))
        assert main([command, str(folder)]) == 2
        line = one_clean_line(capsys.readouterr().err)
        assert expected in line


def test_a_replaced_video_is_named_as_tampered_before_any_replay(copy_of, capsys):
    (copy_of / "video.mp4").write_bytes(os.urandom(1000))
    for command in ("verify", "replay"):
        assert main([command, str(copy_of)]) == 2
        captured = capsys.readouterr()
        assert "was tampered with: video.mp4 differs from the sha256" in one_clean_line(captured.err)
        assert "match" not in captured.out


def test_an_older_folders_edited_request_is_named_by_request_yaml(older_copy, capsys):
    _edit(older_copy, lambda m: m["request"].update(prompt="something else entirely"))
    assert main(["replay", str(older_copy)]) == 2
    assert "manifest.json's request differs from request.yaml" in one_clean_line(capsys.readouterr().err)


def _limited_fsize(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@contextlib.contextmanager
def file_size_limit(limit: int):
    """``ulimit -f`` for this process, soft limit only, put back after (Python ignores SIGXFSZ)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def tiny_generation() -> Generation:
    """A still clip with one second of noise: video.mp4 is a few KiB, audio.wav 172 KiB."""
    frames = np.full((8, 64, 64, 3), 90, dtype=np.uint8)
    audio = np.random.default_rng(0).uniform(-0.5, 0.5, (44100, 2)).astype(np.float32)
    return Generation(frames=frames, audio=audio, fps=24.0, sample_rate=44100,
                      step_records=[{"rank": 0, "stage": "preview", "step": 0, "ms": 1.0}], stage_ms={"preview": 1.0},
                      resolved={"steps": 1}, engine_info={"name": "embedded"})


def test_a_file_too_large_names_the_file_and_the_limit(tmp_path):
    """``ulimit -f`` below audio.wav's size: the line said 'a file operation', now the file and the limit."""
    request = build_request(prompt=PROMPT, steps=1)
    plan = Plan(request, get_tier(request.tier), parse_layout("sp1-cfg1"), {"steps": 1})
    with file_size_limit(64 * 1024):
        with pytest.raises(OSError) as raised:
            runs.write_run(tmp_path, plan, tiny_generation(), time.time())
        line = describe_os_error(raised.value)  # the CLI's line, under the limit it reports
    assert raised.value.errno == errno.EFBIG
    assert line == (
        f"audio.wav of the run folder being written in {tmp_path}: File too large (EFBIG). Fix: this process may "
        "write files of at most 64 KiB (ulimit -f): raise it (ulimit -f unlimited), then run again")
    assert list(tmp_path.iterdir()) == []


def test_a_poster_cut_short_by_the_file_size_limit_is_a_refused_write(tmp_path):
    """Pillow's encoder ignored the short write and left a cut poster.jpg, whose sha256 the manifest then pinned."""
    frame = np.random.default_rng(0).integers(0, 255, (1, 256, 256, 3), dtype=np.uint8)
    with file_size_limit(32 * 1024), pytest.raises(OSError) as raised:
        media.write_poster(tmp_path / "poster.jpg", frame)
    assert raised.value.errno == errno.EFBIG


def test_an_atomic_write_refused_names_its_file(tmp_path):
    """Reports and the queue file go through write_atomic; Python's write names no file."""
    target = tmp_path / "report.json"
    with file_size_limit(4 * 1024), pytest.raises(OSError) as raised:
        write_atomic(target, "x" * 10_000)
    assert raised.value.errno == errno.EFBIG and raised.value.filename == str(target)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_write_refused_by_the_os_is_one_line_and_leaves_no_temp_folder(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "magi2studio.cli", "generate", "--prompt", PROMPT, "--steps", "2", "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, preexec_fn=_limited_fsize(64 * 1024))
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    line = one_clean_line("\n".join(x for x in result.stderr.splitlines() if x.startswith("error:")))
    assert (f"error: video.mp4 of the run folder being written in {out}: File too large (EFBIG). "
            "Fix: this process may write files of at most 64 KiB (ulimit -f)") in line
    assert list(out.iterdir()) == []


@pytest.fixture
def unwritable_folder(tmp_path):
    """A folder this user cannot create a file in: read-only by mode, or (root ignores modes) /sys."""
    if os.geteuid() == 0:
        folder = Path("/sys")
    else:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
    with pytest.raises(OSError):  # the premise, else the test proves nothing
        tempfile.NamedTemporaryFile(dir=folder).close()
    yield folder
    if folder != Path("/sys"):
        folder.chmod(0o755)


def test_an_out_folder_this_user_cannot_write_is_a_refused_write_exit_1(unwritable_folder, capsys):
    """README: a write the system refuses (no permission, read-only, ulimit -f) exits 1; --out was exit 2."""
    assert main(["generate", "--prompt", PROMPT, "--steps", "2", "--out", str(unwritable_folder)]) == 1
    line = one_clean_line(capsys.readouterr().err)
    assert line.startswith(f"error: {unwritable_folder}: ")
    assert any(f"({name}). Fix: " in line for name in ("EACCES", "EPERM", "EROFS")), line


def test_an_out_that_is_a_file_is_bad_input_exit_2(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    for out in (tmp_path / "file", tmp_path / "file" / "below"):
        assert main(["generate", "--prompt", PROMPT, "--steps", "2", "--out", str(out)]) == 2
        assert one_clean_line(capsys.readouterr().err) == (
            f"error: out: {out} is not a folder (it or a folder above it is a file). Fix: choose a folder with --out")


def test_fuzz_counts_leaves_nothing_in_tmpdir(tmp_path):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fuzz_counts.py"), "--examples", "3",
         "--families", "requests,request_yaml,sample_sets,cli_flags"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": str(tmpdir)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["tried"] == 12
    assert list(tmpdir.iterdir()) == []


def test_sigterm_while_the_run_folder_is_written_leaves_nothing(tmp_path, monkeypatch, capsys):
    real_write_wav = media.write_wav

    def terminated_mid_mux(*args, **kwargs):
        real_write_wav(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(media, "write_wav", terminated_mid_mux)
    out = tmp_path / "out"
    assert main(["generate", "--prompt", PROMPT, "--steps", "2", "--out", str(out)]) == 143
    assert "terminated (SIGTERM)" in capsys.readouterr().err
    assert list(out.iterdir()) == []


def test_a_layout_refusal_creates_no_outputs_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["generate", "--prompt", PROMPT, "--layout", "sp3-cfg1"]) == 2
    assert capsys.readouterr().err.startswith("error: layout: ")
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("make, words", [
    (lambda p: p.mkdir(), "is a folder, not a file"),
    (lambda p: os.mkfifo(p), "is a fifo, not a regular file"),
    (None, "is a device, not a regular file"),
])
def test_a_prompt_file_that_is_not_a_regular_file_gets_its_reason(tmp_path, capsys, make, words):
    path = Path("/dev/zero") if make is None else tmp_path / "odd"
    if make is not None:
        make(path)
    assert main(["generate", "--prompt-file", str(path), "--out", str(tmp_path / "out")]) == 2
    line = one_clean_line(capsys.readouterr().err)
    assert line.startswith("error: prompt_file: ") and words in line and "does not exist" not in line
    assert not (tmp_path / "out").exists()


def test_request_files_not_utf8_or_naming_files_outside_their_folder(tmp_path, capsys):
    request = tmp_path / "req" / "r.yaml"
    request.parent.mkdir()
    request.write_bytes(b"prompt: \xff\xfe caf\xe9\n")
    assert main(["generate", "--request", str(request), "--out", str(tmp_path / "out")]) == 2
    assert "request: " in one_clean_line(capsys.readouterr().err)
    request.write_text("prompt_file: ../../../../../../../../etc/passwd\n")
    assert main(["generate", "--request", str(request), "--out", str(tmp_path / "out")]) == 2
    assert "prompt_file: ../../../../../../../../etc/passwd resolves outside the root" in one_clean_line(
        capsys.readouterr().err)
    shutil.copy(SAMPLES / "sample_000.txt", request.parent / "p.txt")
    request.write_text("prompt_file: p.txt\nsteps: 2\n")
    assert main(["generate", "--request", str(request), "--out", str(tmp_path / "out")]) == 0
    assert not hidden_leftovers(tmp_path / "out")
