"""What the studio gives to anyone who can reach it over HTTP (issue 32): what the page shows of complete run
folders (as Gradio's cached copies) and the reports it links, and nothing else of the outputs root (queue
state, locks, hidden temp folders, symlinks out) or outside it, by any route or spelling of a path; job
control (cancel, remove, open, run again) only for the job's own browser or session; a server path sent as a
file is one line naming the field."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import quote

import httpx
import pytest
from gradio_client import Client

from magi2studio.run_folder import runs
from magi2studio.studio.form import FIELDS
from magi2studio.studio.job_panel import JobPanel
from magi2studio.jobs.jobqueue import LOCK_FILE, QUEUE_FILE, RUNNER_LOCK_FILE, JobQueue

from studio_support import generate_args

pytestmark = pytest.mark.slow

PROJECT = Path(__file__).resolve().parents[2]
PROMPT = "A served-files probe: a brass bell on a wooden table; it rings once."
LONG_STEPS = 400  # a job that runs until cancelled


def encoded_dots(path: str) -> str:
    return path.replace("..", "%2e%2e")


def spellings(target: Path, root: Path, inside: Path, uploads: Path) -> list[str]:
    """Every URL under which Gradio might serve ``target``: both file routes, encoded, cwd-relative, via ``..``."""
    absolute = str(target)
    via_run = f"{inside}/{os.path.relpath(target, inside)}"  # <complete run folder>/../<target>
    via_uploads = f"{uploads}/{os.path.relpath(target, uploads)}"  # a served folder, then ../ out of it
    relative = os.path.relpath(target, os.getcwd())  # the server's working folder is this process's
    forms = [f"gradio_api/file={absolute}", f"file={absolute}", f"gradio_api/file/{absolute}",
             f"gradio_api/file={quote(absolute, safe='')}", f"gradio_api/file={relative}",
             f"gradio_api/file={quote(relative, safe='')}", f"gradio_api/file={via_run}",
             f"gradio_api/file={encoded_dots(via_run)}", f"gradio_api/file={via_uploads}",
             f"gradio_api/file={encoded_dots(via_uploads)}", f"gradio_api/file=/{absolute}",
             f"gradio_api/file={absolute.replace('/', '//')}"]
    climb = "%2e%2e%2f" * 12
    forms += [f"static/{climb}{absolute.lstrip('/')}", f"assets/{climb}{absolute.lstrip('/')}",
              f"gradio_api/static/{climb}{absolute.lstrip('/')}"]
    return forms


def fetch(url: str) -> httpx.Response:
    return httpx.get(url, timeout=30, follow_redirects=False)


def wait_until(check, timeout_s: float = 180.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError("timed out")


@pytest.fixture(scope="module")
def planted(studio):
    """A complete run (through /generate) and, beside it, what must never be served; removed afterwards."""
    root = Path(studio.outputs).resolve()
    owner = Client(studio.url, verbose=False)
    result = owner.predict(**generate_args(prompt=PROMPT, seed=31), api_name="/generate")
    complete = next(p for p in root.iterdir() if runs.is_complete(p) and not p.name.startswith(".")
                    and json.loads((p / "manifest.json").read_text())["request"]["prompt"] == PROMPT)
    hidden = root / f".{complete.name}.probe1"  # a run folder still being written looks like this
    shutil.copytree(complete, hidden)
    linked = root / "20990101-000000-t2va-272p-s1-linked"  # complete, but its video is a symlink out
    shutil.copytree(complete, linked)
    (linked / "video.mp4").unlink()
    (linked / "video.mp4").symlink_to(PROJECT / "pyproject.toml")
    report = root / "reproduce" / "20990101-000000"  # what the Reproduce tab links to, and beside it
    (report / ".partial").mkdir(parents=True)
    for path in (report / "report.html", report / "notes.txt", report / ".partial" / "report.html"):
        path.write_text(f"<p>{PROMPT}</p>")
    (root / "escape").symlink_to(PROJECT / "pyproject.toml")
    (root / "escape-dir").symlink_to(PROJECT, target_is_directory=True)
    assert (root / QUEUE_FILE).is_file() and (root / LOCK_FILE).is_file() and (root / RUNNER_LOCK_FILE).is_file()
    try:
        yield {"root": root, "complete": complete, "hidden": hidden, "linked": linked, "report": report,
               "client": owner, "shown": result}
    finally:
        for path in (hidden, linked, root / "reproduce"):
            shutil.rmtree(path, ignore_errors=True)
        for path in (root / "escape", root / "escape-dir"):
            path.unlink(missing_ok=True)


def test_nothing_but_what_the_page_shows_is_served(studio, planted, monkeypatch):
    root, complete, hidden, linked = planted["root"], planted["complete"], planted["hidden"], planted["linked"]
    report = planted["report"]
    uploads = Path(studio.ctx.uploads).resolve()
    monkeypatch.chdir(root.parent)  # so "<outputs folder name>/queue.json" is a path relative to the server's cwd
    secrets = {
        root / QUEUE_FILE: PROMPT, root / LOCK_FILE: None, root / RUNNER_LOCK_FILE: str(os.getpid()),
        hidden / "video.mp4": None, hidden / "manifest.json": PROMPT, linked / "video.mp4": "[project]",
        root / "escape": "[project]", root / "escape-dir" / "pyproject.toml": "[project]",
        report / "notes.txt": PROMPT, report / ".partial" / "report.html": PROMPT,
        Path("/etc/passwd"): "root:", PROJECT / "pyproject.toml": "[project]",
        # Shown by the page only as Gradio's cached copies (below), so not served from the outputs root.
        complete / "video.mp4": None, complete / "manifest.json": PROMPT, complete / "request.yaml": PROMPT,
    }
    leaks = []
    for target, marker in secrets.items():
        for form in spellings(target, root, complete, uploads):
            response = fetch(studio.url + form)
            if response.status_code == 200 or (marker and marker in response.text):
                leaks.append(f"{response.status_code} {form}")
    assert not leaks, "served:\n" + "\n".join(leaks)

    # The control: what the page shows of a complete run (the video and WAV /generate returned, a History
    # poster) and a linked report are served.
    video, wav = planted["shown"][0], planted["shown"][1]
    video = video["video"] if isinstance(video, dict) else video
    posters = studio.ctx.demo.fns  # History's listing, as the page loads it
    load_history = next(f.fn for f in posters.values() if f.name == "load_history")
    poster = next(item[0] for item in load_history(PROMPT)[0] if (complete / "poster.jpg").read_bytes()
                  == Path(item[0]).read_bytes())
    for path, original in ((video, complete / "video.mp4"), (wav, complete / "audio.wav"),
                           (poster, complete / "poster.jpg"), (report / "report.html", report / "report.html")):
        for form in (f"gradio_api/file={path}", f"gradio_api/file={quote(os.path.relpath(path), safe='')}"):
            response = fetch(studio.url + form)
            assert response.status_code == 200, form
            assert response.content == Path(original).read_bytes(), form
    # A component never gets a copy of what a symlink in a run folder points to.
    from magi2studio.studio.served import cached

    assert cached(linked / "video.mp4", root) is None and cached(root / "escape", root) is None
    assert Path(cached(complete / "video.mp4", root)).is_relative_to(uploads)


def _queued_id(job) -> str:
    import re

    def found():
        for output in job.outputs():
            match = re.search(r"job ([0-9a-f]{32})", str(output))
            if match:
                return match.group(1)
        return None

    return wait_until(found)


def _panel_action(studio, action: str, job_id: str, session: str) -> str:
    """A job-list row button's click, sent the way the page sends it (/queue/join), from ``session``."""
    panel_table = studio.ctx.demo.fns
    fn_index, fn = next((i, f) for i, f in panel_table.items() if f.name == "clicked")
    trigger = fn.targets[0][0]
    body = {"data": [], "fn_index": fn_index, "session_hash": session, "trigger_id": trigger,
            "event_data": {"action": action, "job": job_id}}
    assert httpx.post(studio.url + "gradio_api/queue/join", json=body, timeout=30).status_code == 200
    with httpx.stream("GET", studio.url + f"gradio_api/queue/data?session_hash={session}", timeout=60) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:"):
                message = json.loads(line[5:])
                if message.get("msg") == "process_completed":
                    output = message.get("output") or {}
                    data = output.get("data") or [None, None]
                    notice = data[1]
                    return notice.get("value") if isinstance(notice, dict) else str(notice)
    raise AssertionError("no process_completed message")


def _call(studio, api_name: str, data: list, session: str) -> str:
    """A raw HTTP client's /call/<api_name>, with a session hash of its choosing."""
    posted = httpx.post(studio.url + f"gradio_api/call/{api_name}", json={"data": data, "session_hash": session},
                        timeout=30)
    assert posted.status_code == 200, posted.text
    event_id = posted.json()["event_id"]
    text = httpx.get(studio.url + f"gradio_api/call/{api_name}/{event_id}", timeout=60).text
    return text


def test_job_control_needs_the_job_s_own_session(studio, planted):
    queue = JobQueue(planted["root"])
    owner = Client(studio.url, verbose=False)
    running = owner.submit(**generate_args(steps=LONG_STEPS, seed=32), api_name="/generate")
    running_id = _queued_id(running)
    wait_until(lambda: queue.read().find(running_id).state == "running")
    waiting = owner.submit(**generate_args(steps=LONG_STEPS, seed=33), api_name="/generate")
    waiting_id = _queued_id(waiting)
    cli_job = queue.add({**queue.read().find(waiting_id).request, "seed": 34}, "sp1-cfg1", owner="cli",
                        source="cli")
    done = next(job for job in queue.read().jobs if job.run == planted["complete"].name)
    try:
        attacker = Client(studio.url, verbose=False)
        for job_id in (running_id, waiting_id, cli_job.id):
            assert not attacker.predict(job_id, api_name="/cancel_job").startswith("cancelling")
        for session in ("cli", "anonymous", done.owner):
            assert "cancelling" not in _call(studio, "cancel_job", [waiting_id], session)
            assert "cancelling" not in _call(studio, "cancel", [], session)
        for action, job_id in (("cancel", waiting_id), ("cancel", running_id), ("cancel", cli_job.id),
                               ("remove", done.id), ("open", done.id), ("run again", done.id),
                               ("up", waiting_id), ("down", cli_job.id), ("edit", waiting_id), ("edit", cli_job.id)):
            notice = _panel_action(studio, action, job_id, "attacker-session")
            assert notice.startswith("✗ job: "), (action, notice)
        # The list shows every job, with buttons only on the caller's own.
        panel = JobPanel(studio.ctx)
        mine = panel.render(SimpleNamespace(session_hash=planted["client"].session_hash))
        theirs = panel.render(SimpleNamespace(session_hash="attacker-session"))
        assert f'data-action="open" data-job="{done.id}"' in mine and f'data-job="{done.id}"' in theirs
        assert "<button" not in theirs
        state = queue.read()
        assert [state.find(i).state for i in (running_id, waiting_id, cli_job.id)] == ["running", "waiting",
                                                                                       "waiting"]
        assert not state.find(running_id).cancel_requested
        assert state.find(done.id).state == "done"
        assert len([job for job in state.jobs if job.pending]) == 3, "run again queued another's job"
        # The owners may: the submitting client by id, the command line through its queue.
        assert owner.predict(waiting_id, api_name="/cancel_job").startswith("cancelling")
        assert owner.predict(running_id, api_name="/cancel_job").startswith("cancelling")
    finally:
        for job_id in (running_id, waiting_id, cli_job.id):
            if queue.read().find(job_id).pending:
                queue.cancel(job_id)
        wait_until(lambda: not any(job.pending for job in queue.read().jobs))


def test_a_server_path_as_a_file_is_refused_in_one_line(studio, capfd):
    """A file object naming a server path (not an upload): one line naming the field, no traceback."""
    for field, value in (("prompt_file", {"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}),
                         ("image", {"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}),
                         ("prompt_file", {"path": "/etc/passwd"})):
        args = generate_args(mode="i2va" if field == "image" else "t2va", prompt="" if field == "prompt_file" else
                             generate_args()["prompt"])
        args[field] = value
        text = _call(studio, "generate", [args[name] for name in FIELDS], f"server-path-{field}")
        assert "event: error" in text, text
        error = json.loads(text.split("event: error\ndata:", 1)[1].strip().splitlines()[0])
        line = error.get("error") if isinstance(error, dict) else error
        assert isinstance(line, str) and line.startswith(f"{field}: ") and ". Fix: " in line, text
        assert "\n" not in line
        assert "root:" not in text
    assert "Traceback" not in capfd.readouterr().err
