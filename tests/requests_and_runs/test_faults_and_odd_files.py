"""Faults and odd files end in one line naming the problem and the fix, and leave nothing behind.

replay/verify of a malformed or tampered run folder, a write refused by the OS (RLIMIT_FSIZE:
the path a full disk takes), SIGTERM while a run folder is written, prompt and request files
that are folders, fifos, devices or not UTF-8, and a layout refusal in an empty folder.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from magi2studio import media
from magi2studio.run_folder import runs
from magi2studio.cli import main

from .conftest import SAMPLES

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


def test_verify_passes_an_intact_folder(run_folder, capsys):
    assert main(["verify", str(run_folder)]) == 0
    assert "5 files match their sha256" in capsys.readouterr().out


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
def test_a_malformed_manifest_is_one_clean_line_exit_2(copy_of, capsys, command, content, words):
    manifest = copy_of / "manifest.json"
    new = content(manifest.read_text(encoding="utf-8"))
    manifest.write_bytes(new if isinstance(new, bytes) else new.encode("utf-8"))
    assert main([command, str(copy_of)]) == 2
    line = one_clean_line(capsys.readouterr().err)
    assert words in line


def test_a_replaced_video_is_named_as_tampered_before_any_replay(copy_of, capsys):
    (copy_of / "video.mp4").write_bytes(os.urandom(1000))
    for command in ("verify", "replay"):
        assert main([command, str(copy_of)]) == 2
        captured = capsys.readouterr()
        assert "was tampered with: video.mp4 differs from the sha256" in one_clean_line(captured.err)
        assert "match" not in captured.out


def test_an_edited_manifest_request_is_named_as_tampered(copy_of, capsys):
    manifest = json.loads((copy_of / "manifest.json").read_text())
    manifest["request"]["prompt"] = "something else entirely"
    (copy_of / "manifest.json").write_text(json.dumps(manifest))
    assert main(["replay", str(copy_of)]) == 2
    assert "manifest.json's request differs from request.yaml" in one_clean_line(capsys.readouterr().err)


def _limited_fsize(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


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
    assert "File too large (EFBIG). Fix: raise the file-size limit (ulimit -f)" in line
    assert list(out.iterdir()) == []


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
