"""Issue 29: a queued job keeps the embedded weights it was queued for, and a runner on other weights fails it
in one line instead of running it on its own; "Use these settings" warns when the run's weights are not the
studio's. Fast: no run is made (the runner's execute_job is a stand-in, run folders are written by hand)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from magi2studio import cli
from magi2studio.engines.embedded.tiny_weights import TRAINED_SHA256
from magi2studio.jobs import runner
from magi2studio.jobs.jobqueue import JobQueue
from magi2studio.run_folder.runs import MANIFEST_VERSION, RUN_FILES
from magi2studio.studio import form as F
from magi2studio.studio import tab_results
from magi2studio.studio.slot import EngineSlot
from magi2studio.vocabulary.layouts import parse_layout
from magi2studio.vocabulary.request import build_request

REQUEST = build_request(prompt="A red kite over a grey sea", seed=5, steps=2).model_dump(mode="json")


@pytest.fixture
def ran(monkeypatch) -> list[str]:
    """The jobs ``queue run`` ran, by id: its execute_job is a stand-in (no engine starts)."""
    ids: list[str] = []

    def execute_job(engine, plan, outputs_root, record, **_):
        ids.append(record.id)
        return runner.Outcome("done", message="stand-in run")

    monkeypatch.setattr(runner, "execute_job", execute_job)
    return ids


def add(out: Path, capsys, *weights: str) -> str:
    assert cli.main(["queue", "add", "--out", str(out), "--prompt", "A kite", "--steps", "2", *weights]) == 0
    return capsys.readouterr().out.split()[2]


def test_a_job_keeps_its_weights_and_a_runner_on_others_fails_it_in_one_line(tmp_path, capsys, ran):
    out = tmp_path / "outputs"
    job_id = add(out, capsys, "--weights", "random")
    job = JobQueue(out).read().find(job_id)
    assert (job.weights, job.weights_sha256) == ("random", None)
    assert cli.main(["queue", "list", "--out", str(out)]) == 0
    assert "weights random" in capsys.readouterr().out

    assert cli.main(["queue", "run", "--out", str(out), "--weights", "trained"]) == 1
    printed = capsys.readouterr()
    job = JobQueue(out).read().find(job_id)
    assert ran == [] and job.state == "failed"
    line = job.message
    assert "\n" not in line and "Traceback" not in printed.out + printed.err
    assert line == (f"weights: job #{job.ticket} ({job_id[:8]}) was queued for the embedded weights random, but "
                    f"this runner's engine runs trained (tree sha256 {TRAINED_SHA256[:12]}), which would give "
                    "another result. Fix: run it with `magi2studio queue run --weights random` (no studio serving "
                    "this outputs folder), or add it again to run it on trained")
    assert f"  failed: {line}\n" in printed.out

    again = add(out, capsys, "--weights", "random")
    assert cli.main(["queue", "run", "--out", str(out), "--weights", "random"]) == 0
    assert ran == [again] and JobQueue(out).read().find(again).state == "done"


def test_a_job_recorded_before_jobs_kept_weights_runs_on_the_runner_s(tmp_path, capsys, ran):
    out = tmp_path / "outputs"
    queue = JobQueue(out)
    old = queue.add(REQUEST, "sp1-cfg1", owner="cli", source="cli")
    data = json.loads((out / "queue.json").read_text())
    for job in data["jobs"]:  # the file as the code before issue 29 wrote it: no weights keys at all
        del job["weights"], job["weights_sha256"]
    (out / "queue.json").write_text(json.dumps(data))
    assert queue.read().find(old.id).weights is None
    assert cli.main(["queue", "run", "--out", str(out), "--weights", "trained"]) == 0
    assert ran == [old.id] and queue.read().find(old.id).state == "done"


class Trained:
    """A studio engine on the shipped weights that never runs: a job of other weights is never planned."""

    name, layout = "embedded", None

    def weights_record(self):
        return "trained", TRAINED_SHA256

    def plan(self, request, layout):
        raise AssertionError("a job of other weights is never planned")


def test_the_studio_records_its_engine_s_weights_and_fails_a_job_of_others(tmp_path):
    slot = EngineSlot(Trained(), tmp_path)
    try:
        slot.steer("set_paused", True)
        plan = SimpleNamespace(request=build_request(**REQUEST), layout=parse_layout("sp1-cfg1"), resolved={})
        (mine,) = slot.submit_batch([(plan, "")], owner="page")
        record = slot.snapshot().find(mine.id)
        assert (record.weights, record.weights_sha256) == ("trained", TRAINED_SHA256)
        slot.steer("cancel", mine.id)
        other = JobQueue(tmp_path).add(REQUEST, "sp1-cfg1", owner="cli", source="cli", weights=("random", None))
        slot.steer("set_paused", False)
        deadline = time.monotonic() + 30
        while (job := JobQueue(tmp_path).read().find(other.id)).pending and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        slot.close()
    assert job.state == "failed" and job.message.startswith(f"weights: job #{job.ticket} ")
    assert "queue run --weights random" in job.message and "\n" not in job.message


def test_the_studio_s_job_list_says_when_a_waiting_job_was_queued_for_other_weights(tmp_path):
    from magi2studio.studio.job_panel import JobPanel

    class Planning(Trained):  # the job list estimates a waiting job of its own weights
        def plan(self, request, layout):
            return SimpleNamespace(request=request, layout=layout, resolved={})

    slot = EngineSlot(Planning(), tmp_path)
    try:
        slot.steer("set_paused", True)
        queue = JobQueue(tmp_path)
        other = queue.add(REQUEST, "sp1-cfg1", owner="cli", source="cli", weights=("random", None))
        same = queue.add({**REQUEST, "seed": 6}, "sp1-cfg1", owner="cli", source="cli",
                         weights=("trained", TRAINED_SHA256))
        panel = JobPanel(SimpleNamespace(engine=Planning(), slot=slot, outputs_root=tmp_path))
        deadline = time.monotonic() + 30  # the slot re-reads a queue file another process wrote
        while not {other.id, same.id} <= (rows := {row["id"]: row for row in panel.rows()}).keys():
            assert time.monotonic() < deadline, rows
            time.sleep(0.05)
    finally:
        slot.close()
    assert "queued for the weights random, this studio runs trained: it will fail" in rows[other.id]["detail"]
    assert "weights" not in rows[same.id]["detail"]


# -- "Use these settings": the run's weights against the studio's -------------------------------------------
def run_folder(root: Path, engine: dict) -> Path:
    folder = root / "run-1"
    folder.mkdir(parents=True)
    for name in RUN_FILES:
        (folder / name).write_bytes(b"x")
    manifest = {"manifest_version": MANIFEST_VERSION, "request": REQUEST, "resolved": {"steps": 2}, "files": {},
                "layout": parse_layout("sp1-cfg1").as_dict(), "engine": engine,
                "hashes": {"frames_sha256": "a" * 64, "pcm_sha256": "b" * 64}}
    (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return folder


class Embedded:
    name = "embedded"

    def __init__(self, weights: str, digest: str | None):
        self.record = (weights, digest)

    def weights_record(self):
        return self.record

    def info(self):
        return {"name": "embedded", "embedded": True, "weights": self.record[0],
                **({"weights_sha256": self.record[1]} if self.record[1] else {})}


def fill(tmp_path: Path, run_engine: dict, studio_engine) -> tuple[list, str]:
    ctx = SimpleNamespace(engine=studio_engine, form=SimpleNamespace(values_from_manifest=F.values_from_manifest))
    values = tab_results.settings_of_run(ctx, str(run_folder(tmp_path, run_engine)))
    return values[:-1], values[-1]


def test_use_these_settings_warns_when_the_run_s_weights_are_not_the_studio_s(tmp_path):
    random_run = {"name": "embedded", "embedded": True, "weights": "random"}
    values, warning = fill(tmp_path, random_run, Embedded("trained", TRAINED_SHA256))
    assert values == F.values_from_manifest(json.loads((tmp_path / "run-1" / "manifest.json").read_text()))
    assert warning["visible"] is True
    text = warning["value"]
    assert "run-1 ran on the embedded weights random" in text and "this studio runs trained" in text
    assert "will differ" in text and f"magi2studio replay {tmp_path / 'run-1'}" in text


def test_use_these_settings_gives_no_warning_when_the_weights_match(tmp_path):
    trained_run = {"name": "embedded", "embedded": True, "weights": "/elsewhere/tiny-trained",
                   "weights_sha256": TRAINED_SHA256}  # the shipped tree, at another install's path
    _, warning = fill(tmp_path, trained_run, Embedded("trained", TRAINED_SHA256))
    assert warning["visible"] is False and not warning["value"]
