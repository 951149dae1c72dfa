"""Issue 29: a cancel lands in every stage of a job, not only at a denoising step.

A cancel while the engine starts stops its ranks (the job ends cancelled in about a second, not
after the 10-20 s start); one at a decode or the mux stops before the next stage or file, and no
run folder appears. Each test prints how long the cancel took (``pytest -s``)."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

from magi2studio.engines.embedded.engine import EmbeddedEngine
from magi2studio.jobs.jobqueue import JobRecord
from magi2studio.jobs.runner import execute_job
from magi2studio.vocabulary.layouts import parse_layout
from magi2studio.vocabulary.request import build_request

REQUEST = build_request(prompt="a red kite over a windy beach, waves and gulls", steps=2, seed=29)
# Generous for a loaded 2-core machine: the cancel itself is a 0.2 s poll plus killing the ranks, or one
# all-reduce; the stages it cuts short (a start, decode + decode + mux) take longer there.
BOUND_S = 5.0


def record(layout: str) -> JobRecord:
    return JobRecord(id="c" * 32, ticket=1, state="running", request=REQUEST.model_dump(mode="json"), layout=layout,
                     owner="test", source="cli", submitted=time.time())


def run_job(engine, layout: str, out, cancel_at: str | None = None, delay_s: float = 0.0):
    """One job through the runner; ``cancel_at``: set the cancel ``delay_s`` after that stage's event."""

    cancel, asked = threading.Event(), []

    def ask() -> None:
        asked.append(time.monotonic())
        cancel.set()

    def on_progress(event) -> None:
        if event.stage == cancel_at and event.step is None and not asked and not cancel.is_set():
            if delay_s:
                threading.Timer(delay_s, ask).start()
            else:
                ask()

    plan = engine.plan(REQUEST, parse_layout(layout))
    outcome = execute_job(engine, plan, out, record(layout), on_progress=on_progress, cancel=cancel)
    took = time.monotonic() - asked[0] if asked else None
    return outcome, took


def folders(root) -> list[str]:
    """Everything but the runner's progress file: a run folder, or a hidden temp one left behind."""
    return sorted(p.name for p in root.iterdir() if p.name != ".queue-progress.json")


def rank_processes() -> list[str]:
    return [p.name for p in multiprocessing.active_children() if p.name.startswith("magi2studio-rank")]


@pytest.mark.slow
def test_a_cancel_while_the_engine_starts_stops_its_ranks_at_once_and_the_next_job_starts_cleanly(tmp_path):
    engine = EmbeddedEngine()
    try:
        # 2 s in, the two ranks are importing torch or meeting for gloo; their start takes 10-20 s here.
        outcome, took = run_job(engine, "sp2-cfg1", tmp_path, cancel_at="load", delay_s=2.0)
        print(f"cancel during the engine start: {took:.2f} s from the cancel to the job's end ({outcome.message})")
        assert outcome.state == "cancelled", outcome.message
        assert outcome.message.startswith("cancelled while the engine started; no run folder was kept")
        assert took < BOUND_S
        assert engine.layout is None and rank_processes() == []  # killed, not left to finish
        assert folders(tmp_path) == []
        following, _ = run_job(engine, "sp1-cfg1", tmp_path)
        assert following.state == "done", following.message
        assert following.run.manifest["studio"]["engine_start_s"] > 0
        print(f"the next job's full engine start (sp1-cfg1): {following.run.manifest['studio']['engine_start_s']} s")
    finally:
        engine.close()


@pytest.mark.slow
@pytest.mark.parametrize(("stage", "delay_s"), [("decode_video", 0.0), ("decode_video", 0.5), ("decode_audio", 0.0),
                                                ("mux", 0.0)])
def test_a_cancel_at_or_in_a_decode_or_the_mux_ends_cancelled_with_no_run_folder(engine, stage, delay_s, tmp_path):
    """0.5 s into decode video (about 2 s here), the cancel lands at decode audio's start."""
    pids = engine._pool.pids
    outcome, took = run_job(engine, "sp1-cfg1", tmp_path, cancel_at=stage, delay_s=delay_s)
    print(f"cancel {delay_s} s into {stage}: {took:.2f} s to the job's end ({outcome.message})")
    assert outcome.state == "cancelled", outcome.message
    assert took < BOUND_S
    assert folders(tmp_path) == []
    assert engine._pool.pids == pids  # the pool stays up for the next job


@pytest.mark.slow
def test_every_rank_stops_at_the_decode_boundary_and_the_pool_runs_the_next_job(tmp_path):
    engine = EmbeddedEngine()
    try:
        engine.start(parse_layout("sp2-cfg1"))
        pids = engine._pool.pids
        outcome, took = run_job(engine, "sp2-cfg1", tmp_path / "cancelled", cancel_at="decode_video")
        print(f"sp2-cfg1, cancel at decode_video: {took:.2f} s to the job's end ({outcome.message})")
        assert outcome.state == "cancelled", outcome.message
        assert outcome.message.startswith("cancelled at a stage boundary; no run folder was kept "
                                          "(stopped before decode_video)")
        assert took < BOUND_S
        assert folders(tmp_path / "cancelled") == []
        following, _ = run_job(engine, "sp2-cfg1", tmp_path / "next")
        assert following.state == "done", following.message
        assert engine._pool.pids == pids and "engine_start_s" not in following.run.manifest["studio"]
    finally:
        engine.close()


def test_a_cancel_before_the_run_starts_leaves_no_preview_folder(engine, tmp_path, monkeypatch):
    """A cancel between the engine's start and its run ("before the run started") used to leave the run's
    empty magi2studio-preview-* folder in the temp folder: it was made before the cancel check."""
    import tempfile

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    cancel = threading.Event()
    cancel.set()
    plan = engine.plan(REQUEST, parse_layout("sp1-cfg1"))
    outcome = execute_job(engine, plan, tmp_path / "out", record("sp1-cfg1"), cancel=cancel)
    assert outcome.state == "cancelled" and outcome.where == "before the run started", outcome.message
    assert list(temp.iterdir()) == []
