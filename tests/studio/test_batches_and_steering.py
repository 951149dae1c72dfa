"""Batches and sweeps (jobs/batches.py) and steering the queue file: expansion, seed policies, grid refusals,
all-or-nothing batches at the bound, pause, move and edit (also from several processes at once through the
flock), and the ``magi2studio queue`` commands for them."""

from __future__ import annotations

import json
import multiprocessing
import re

import pytest

from magi2studio import cli
from magi2studio.errors import InputError
from magi2studio.jobs.batches import MAX_BATCH_RUNS, expand, parse_spec
from magi2studio.jobs.jobqueue import JobQueue
from magi2studio.jobs.runner import plan_record
from magi2studio.vocabulary.request import build_request

BASE = build_request(prompt="A red kite over a grey sea", seed=5, steps=2).model_dump(mode="json")


# -- expansion and seed policies ---------------------------------------------------------------------
def test_count_with_each_seed_policy():
    fixed = expand(BASE, "sp1-cfg1", parse_spec(count=3, seed_policy="fixed"))
    assert [item.fields["seed"] for item in fixed] == [5, 5, 5]
    assert [item.label for item in fixed] == ["run 1 of 3", "run 2 of 3", "run 3 of 3"]
    increment = expand(BASE, "sp1-cfg1", parse_spec(count=3, seed_policy="increment"))
    assert [item.fields["seed"] for item in increment] == [5, 6, 7]
    assert [item.label for item in increment] == ["seed 5", "seed 6", "seed 7"]
    assert not any(item.seed_drawn for item in fixed + increment)
    drawn = expand(BASE, "sp1-cfg1", parse_spec(count=4, seed_policy="random"))
    seeds = [item.fields["seed"] for item in drawn]
    assert all(item.seed_drawn for item in drawn) and all(0 <= seed < 2**31 for seed in seeds)
    assert len(set(seeds)) == 4 and [item.label for item in drawn] == [f"seed {seed}" for seed in seeds]


def test_seed_minus_one_is_drawn_once_for_fixed_and_increment():
    items = expand({**BASE, "seed": -1}, "sp1-cfg1", parse_spec(count=3, seed_policy="increment"))
    first = items[0].fields["seed"]
    assert first >= 0 and [item.fields["seed"] for item in items] == [first, first + 1, first + 2]
    assert all(item.seed_drawn for item in items)  # the runs record that -1 was asked


def test_a_prompt_list_and_a_grid_cross_every_combination():
    spec = parse_spec(prompts="a kite\n\n  a gull  \n", steps="2,4", layouts="sp1-cfg1, sp2-cfg1",
                      deterministic="on,off")
    items = expand(BASE, "sp1-cfg1", spec)
    assert len(items) == spec.size() == 2 * 2 * 2 * 2
    combos = {(i.fields["prompt"], i.fields["steps"], i.layout, i.fields["deterministic"]) for i in items}
    assert len(combos) == 16 and all(i.fields["seed"] == 5 and i.fields["prompt_file"] is None for i in items)
    assert items[0].label == "prompt 1: a kite · steps 2 · sp1-cfg1 · deterministic"
    assert items[-1].label == "prompt 2: a gull · steps 4 · sp2-cfg1 · not deterministic"
    seeds = expand(BASE, "sp1-cfg1", parse_spec(seeds="7,8,9"))
    assert [(i.fields["seed"], i.label) for i in seeds] == [(7, "seed 7"), (8, "seed 8"), (9, "seed 9")]


@pytest.mark.parametrize("fields, expected", [
    ({"steps": "4,x"}, r"^grid_steps: 'x' is not a whole number\. Fix: "),
    ({"steps": "0,4"}, r"^grid_steps: a step count is below 1\. Fix: "),
    ({"steps": "4,4"}, r"^grid_steps: names a value twice\. Fix: "),
    ({"layouts": "sp1-cfg1,sp0"}, r"^grid_layouts: 'sp0': .*Fix: "),
    ({"deterministic": "on,maybe"}, r"^grid_deterministic: 'maybe' is not on or off\. Fix: "),
    ({"seeds": "1,2", "count": 2}, r"^grid_seeds: the grid names the seeds .*Fix: "),
    ({"seeds": "1,-3"}, r"^grid_seeds: a seed is below 0\. Fix: "),
    ({"count": 0}, r"^count: 0 is below 1\. Fix: "),
    ({"count": "three"}, r"^count: 'three' is not a whole number\. Fix: "),
    ({"seed_policy": "sometimes"}, r"^seed_policy: 'sometimes' is not a seed policy\. Fix: use one of fixed, "),
    ({"count": MAX_BATCH_RUNS, "steps": "1,2"}, rf"^count: the batch makes {2 * MAX_BATCH_RUNS} runs "),
])
def test_a_bad_batch_is_refused_in_one_line_naming_the_field(fields, expected):
    with pytest.raises(InputError) as err:
        parse_spec(**fields)
    assert re.search(expected, str(err.value)) and "\n" not in str(err.value)


# -- the queue file: a batch, pause, move, edit --------------------------------------------------------
def _runs(count: int) -> list:
    return [({**BASE, "seed": seed}, "sp1-cfg1", f"seed {seed}", False) for seed in range(count)]


def test_a_batch_enters_whole_with_one_batch_id_or_not_at_all(tmp_path):
    queue = JobQueue(tmp_path)
    queue.open_for_runner(max_waiting=4)
    queue.add(BASE, "sp1-cfg1", owner="a", source="cli")
    jobs = queue.add_batch(_runs(3), owner="a", source="cli")
    assert len({job.batch for job in jobs}) == 1 and jobs[0].batch and [j.label for j in jobs] == [
        "seed 0", "seed 1", "seed 2"]
    assert queue.read().jobs[0].batch is None  # a single run is no batch
    queue.cancel(jobs[0].id)  # 3 wait: one place is left
    before = (tmp_path / "queue.json").read_bytes()
    with pytest.raises(InputError, match=r"^queue: a batch of 3 runs does not fit: 3 wait and the limit is 4\. "
                                         r"Fix: queue at most 1 runs now"):
        queue.add_batch(_runs(3), owner="a", source="cli")
    assert (tmp_path / "queue.json").read_bytes() == before


def test_pause_stops_claims_and_survives_a_new_reader(tmp_path):
    queue = JobQueue(tmp_path)
    first, second = queue.add_batch(_runs(2), owner="a", source="cli")
    assert queue.claim_next().id == first.id
    queue.set_paused(True)
    assert JobQueue(tmp_path).read().paused  # in the file: a restarted runner finds it
    assert json.loads((tmp_path / "queue.json").read_text())["paused"] is True
    assert queue.claim_next() is None and queue.read().find(second.id).state == "waiting"
    assert queue.read().find(first.id).state == "running"  # the running job is left alone
    queue.set_paused(False)
    assert queue.claim_next().id == second.id


def test_move_reorders_the_waiting_jobs_only(tmp_path):
    queue = JobQueue(tmp_path)
    a, b, c, d = queue.add_batch(_runs(4), owner="a", source="cli")
    queue.claim_next()  # a runs
    assert queue.move(d.id, -1) == 2
    assert [job.id for job in queue.read().waiting()] == [b.id, d.id, c.id]
    assert queue.move(b.id, +5) == 3  # past the end: the last place
    assert queue.move(c.id, -9) == 1
    state = queue.read()
    assert [job.id for job in state.waiting()] == [c.id, d.id, b.id] and state.jobs[0].id == a.id
    assert queue.claim_next().id == c.id  # the runner takes the file's order
    with pytest.raises(InputError, match=r"^job: #1 is running, not waiting\. Fix: only a waiting job can be moved"):
        queue.move(a.id, 1)


def test_edit_replaces_a_waiting_request_and_refuses_a_started_job(tmp_path):
    queue = JobQueue(tmp_path)
    first, second = queue.add_batch(_runs(2), owner="a", source="cli")
    queue.claim_next()
    edited = queue.edit(second.id, {**BASE, "seed": 77}, "sp2-cfg1", seed_drawn=True)
    stored = queue.read().find(second.id)
    assert stored == edited and stored.request["seed"] == 77 and stored.layout == "sp2-cfg1" and stored.seed_drawn
    assert stored.batch == second.batch and stored.ticket == second.ticket
    with pytest.raises(InputError, match=r"^job: #1 is running, not waiting\. Fix: only a waiting job can be edited"):
        queue.edit(first.id, BASE, "sp1-cfg1")


def test_a_drawn_seed_is_recorded_when_the_stored_job_is_planned():
    from magi2studio.engines import get_engine
    from magi2studio.jobs.jobqueue import JobRecord

    record = JobRecord(id="f" * 32, ticket=1, state="waiting", request=BASE, layout="sp1-cfg1", owner="cli",
                       source="cli", submitted=0.0, seed_drawn=True)
    assert plan_record(get_engine("embedded"), record).resolved["seed_asked"] == -1


def _steer(root: str, worker: int) -> None:
    queue = JobQueue(root)
    for index in range(8):
        (job,) = queue.add_batch([({**BASE, "seed": worker * 100 + index}, "sp1-cfg1", "", False)],
                                 owner=f"w{worker}", source="cli")
        queue.move(job.id, -1)
        queue.set_paused(index % 2 == 0)


def test_concurrent_adds_moves_and_pauses_lose_nothing(tmp_path):
    """Four processes add, move and pause at once: every job is kept once, with its own ticket."""
    JobQueue(tmp_path).open_for_runner(max_waiting=64)
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_steer, args=(str(tmp_path), worker)) for worker in range(4)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(timeout=120)
        assert process.exitcode == 0
    state = JobQueue(tmp_path).read()
    assert len(state.jobs) == 32 and sorted(job.ticket for job in state.jobs) == list(range(1, 33))
    assert sorted(job.request["seed"] for job in state.jobs) == sorted(w * 100 + i for w in range(4) for i in range(8))
    assert state.next_ticket == 33


# -- the command line ----------------------------------------------------------------------------------
def test_queue_add_count_and_seed_policy(tmp_path, capsys):
    out = tmp_path / "outputs"
    assert cli.main(["queue", "add", "--out", str(out), "--prompt", "A kite", "--seed", "9", "--steps", "2",
                     "--count", "3", "--seed-policy", "increment"]) == 0
    printed = capsys.readouterr().out
    jobs = JobQueue(out).read().jobs
    assert [job.request["seed"] for job in jobs] == [9, 10, 11] and len({job.batch for job in jobs}) == 1
    assert printed.startswith(f"queued batch {jobs[0].batch}: 3 runs, #1 to #3, in ") and "seed 11" in printed
    assert cli.main(["queue", "add", "--out", str(out), "--prompt", "A kite", "--count", "2",
                     "--seed-policy", "random"]) == 0
    drawn = JobQueue(out).read().jobs[3:]
    assert all(job.seed_drawn for job in drawn) and drawn[0].request["seed"] != drawn[1].request["seed"]


def test_queue_add_prompts_file_and_grid(tmp_path, capsys):
    out, prompts = tmp_path / "outputs", tmp_path / "prompts.txt"
    prompts.write_text("A kite over the sea\n\nA gull on a pier\n", encoding="utf-8")
    assert cli.main(["queue", "add", "--out", str(out), "--prompts", str(prompts), "--steps", "2",
                     "--grid-steps", "2,3", "--grid-layouts", "sp1-cfg1,sp2-cfg1"]) == 0
    jobs = JobQueue(out).read().jobs
    assert len(jobs) == 8 and {job.request["prompt"] for job in jobs} == {"A kite over the sea", "A gull on a pier"}
    assert {(job.request["steps"], job.layout) for job in jobs} == {(2, "sp1-cfg1"), (3, "sp1-cfg1"),
                                                                    (2, "sp2-cfg1"), (3, "sp2-cfg1")}


@pytest.mark.parametrize("flags, expected", [
    (["--grid-steps", "2,zero"], r"^error: grid_steps: 'zero' is not a whole number\. Fix: "),
    (["--grid-layouts", "sp1-cfg1,sp3-cfg1"], r"^error: layout: .*Fix: "),  # planned at the door: sp3 refused
    (["--count", "40"], r"^error: queue: a batch of 40 runs does not fit: 0 wait and the limit is 32\. Fix: "),
    (["--prompts", "missing.txt"], r"^error: prompts: .*Fix: "),
])
def test_queue_add_refuses_a_bad_batch_and_queues_none_of_it(tmp_path, capsys, flags, expected):
    out = tmp_path / "outputs"
    assert cli.main(["queue", "add", "--out", str(out), "--prompt", "A kite", "--steps", "2", *flags]) == 2
    err = capsys.readouterr().err
    assert re.search(expected, err) and err.count("\n") == 1
    assert not (out / "queue.json").exists() or JobQueue(out).read().jobs == []


def test_queue_pause_resume_move_and_watch(tmp_path, capsys):
    out = tmp_path / "outputs"
    assert cli.main(["queue", "add", "--out", str(out), "--prompt", "A kite", "--steps", "2", "--count", "3",
                     "--seed-policy", "increment"]) == 0
    a, b, c = JobQueue(out).read().jobs
    capsys.readouterr()
    assert cli.main(["queue", "pause", "--out", str(out)]) == 0
    assert capsys.readouterr().out == "paused: no waiting job starts (3 wait)\n" and JobQueue(out).read().paused
    assert cli.main(["queue", "move", "--out", str(out), c.id[:8], "up", "--by", "2"]) == 0
    assert capsys.readouterr().out == f"{c.id[:8]}: now at position 1\n"
    assert [job.id for job in JobQueue(out).read().waiting()] == [c.id, a.id, b.id]
    assert cli.main(["queue", "list", "--out", str(out)]) == 0
    assert "paused (magi2studio queue resume)" in capsys.readouterr().out
    assert cli.main(["queue", "watch", "--out", str(out)]) == 0  # jobs wait, but no runner serves the root
    assert capsys.readouterr().out.startswith("queue idle (3 waiting, but no studio or queue run serves ")
    assert cli.main(["queue", "resume", "--out", str(out)]) == 0
    assert capsys.readouterr().out == "resumed: 3 waiting\n" and not JobQueue(out).read().paused
    assert cli.main(["queue", "move", "--out", str(out), "ffffffff", "down"]) == 2
    assert capsys.readouterr().err.startswith("error: job: 'ffffffff' is not a job in the queue. Fix: ")


# -- the studio's door -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def door():
    """What the batch form's planning uses of the studio: the engine, its capabilities, no upload folder."""
    from types import SimpleNamespace

    from magi2studio.engines import get_engine

    engine = get_engine("embedded")
    return SimpleNamespace(engine=engine, capabilities=engine.capabilities(), uploads=None)


def test_the_studio_plans_every_run_of_a_batch_at_the_door(door):
    from magi2studio.studio.batch_panel import plan_batch

    form = {"prompt": "A kite", "seed": -1, "steps": "2", "layout_preset": "sp1-cfg1"}
    plans = plan_batch(form, {"count": 2, "seed_policy": "random", "steps": "2,3"}, door)
    assert [plan.request.steps for plan, _ in plans] == [2, 2, 3, 3]
    assert all(plan.resolved["seed_asked"] == -1 for plan, _ in plans)  # each drawn seed recorded as -1 is
    assert [label for _, label in plans] == [f"seed {plan.request.seed} · steps {plan.request.steps}"
                                             for plan, _ in plans]
    with pytest.raises(InputError, match=r"^prompt: .*Fix: "):  # the base form is checked as Generate checks it
        plan_batch({**form, "prompt": " "}, {"count": 2}, door)
    with pytest.raises(InputError, match=r"^layout: .*Fix: "):  # the engine refuses one combination: no plans
        plan_batch(form, {"layouts": "sp1-cfg1,sp3-cfg1"}, door)


def _running_job(root):
    from magi2studio.jobs.runner import RunnerLock

    queue = JobQueue(root)
    job = queue.add(BASE, "sp1-cfg1", owner="cli", source="cli")
    runner = RunnerLock(root)
    queue.claim_next()
    return queue, job, runner


def test_the_runner_publishes_progress_for_watch_at_most_twice_a_second(tmp_path):
    from magi2studio.engines.base import Progress
    from magi2studio.jobs.runner import _published, read_progress

    queue, job, runner = _running_job(tmp_path)
    runner.release()
    seen = []
    publish = _published(seen.append, tmp_path, job)
    publish(Progress("preview", step=0, total=4))
    publish(Progress("preview", step=1, total=4))  # within 0.5 s: passed on, not written
    assert read_progress(tmp_path)["step"] == 0 and len(seen) == 2
    publish(Progress("preview", step=3, total=4))  # the last step is always written
    publish(Progress("decode_video"))  # so is a stage
    assert read_progress(tmp_path) == {**read_progress(tmp_path), "job": job.id, "stage": "decode_video", "step": None}


def test_queue_watch_follows_the_running_job_until_the_queue_is_idle(tmp_path, capsys):
    import threading
    import time

    from magi2studio.jobs.runner import PROGRESS_FILE

    queue, job, runner = _running_job(tmp_path)
    (tmp_path / PROGRESS_FILE).write_text(json.dumps({"job": job.id, "ticket": 1, "stage": "preview", "step": 2,
                                                      "total": 8, "message": "", "written": 0}))

    def finish() -> None:
        time.sleep(1.0)
        queue.update(job.id, state="done", finished=time.time(), run="20261206-000000-t2va-272p-s5-abc")

    threading.Thread(target=finish).start()
    try:
        assert cli.main(["queue", "watch", "--out", str(tmp_path), "--interval", "0.1"]) == 0
    finally:
        runner.release()
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(rf"#1 {job.id[:8]} preview step 3/8 · \d+ s · 0 waiting", lines[0])
    assert lines[-2:] == [f"#1 {job.id[:8]} done: 20261206-000000-t2va-272p-s5-abc", "queue idle"]


def test_queue_watch_ends_on_ctrl_c_with_one_line(tmp_path, capsys, monkeypatch):
    from magi2studio.commands import queue_watch as queue_command

    queue, job, runner = _running_job(tmp_path)

    def interrupted(_seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(queue_command.time, "sleep", interrupted)
    try:
        assert cli.main(["queue", "watch", "--out", str(tmp_path)]) == 0
    finally:
        runner.release()
    assert capsys.readouterr().out.splitlines() == [f"#1 {job.id[:8]} starting · 0 s · 0 waiting",
                                                    "stopped watching; the queue goes on"]
