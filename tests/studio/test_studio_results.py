"""What the Results view derives from a run: the timing plot's series and the summary table."""

from __future__ import annotations

from magi2studio.studio.results import summary_frame, timing_frame
from magi2studio.engines.timing import gate_summary


def records(ranks: int, steps: int) -> list[dict]:
    return [{"rank": r, "stage": "preview", "step": s, "ms": 100.0 + 10 * s + r} for s in range(steps)
            for r in range(ranks)]


def test_steps_0_and_1_are_their_own_excluded_series_and_each_rank_is_drawn():
    frame = timing_frame(records(ranks=2, steps=4))
    excluded = frame[frame.series == "preview steps 0-1 (excluded)"]
    assert excluded.step.tolist() == [0, 1]
    slowest = frame[frame.series == "preview slowest rank"]
    assert slowest.step.tolist() == [2, 3] and slowest.ms.tolist() == [121.0, 131.0]
    assert len(frame[frame.series == "preview rank 0"]) == 4 and len(frame[frame.series == "preview rank 1"]) == 4


def test_one_rank_is_drawn_once():
    assert set(timing_frame(records(ranks=1, steps=3)).series) == {
        "preview steps 0-1 (excluded)", "preview rank 0 (the only rank)"}


def test_the_summary_shows_the_gate_metric_of_the_slowest_rank():
    summary = gate_summary(records(ranks=2, steps=4), "preview")
    table = summary_frame({"timing": {"stages": {"preview": summary}, "stage_ms": {"decode_video": 12.5}}})
    rows = dict(zip(table.what, table.value))
    assert rows["preview gate metric (slowest rank, steps 0-1 dropped)"] == "126.0 ms/step"
    assert rows["preview median / min / max"] == "126.0 ms / 121.0 ms / 131.0 ms"
    assert rows["stage decode_video"] == "12.5 ms"


def test_long_times_read_in_seconds_and_minutes_not_raw_ms():
    summary = {**gate_summary(records(ranks=1, steps=4), "preview"), "total_ms": 525481.2}
    table = summary_frame({"timing": {"stages": {"preview": summary}, "stage_ms": {"decode_video": 4200.0}}})
    rows = dict(zip(table.what, table.value))
    assert rows["preview total"] == "8.8 min (525 s)"
    assert rows["stage decode_video"] == "4.2 s"
    assert rows["preview median / min / max"].endswith(" ms")  # a step stays in ms


def test_the_summary_says_the_engine_start_the_run_waited_for():
    """The audit: the timing summary left out the engine start (41 s of a first result's wait)."""
    def engine_start(manifest: dict) -> str:
        table = summary_frame({"timing": {"stages": {}, "stage_ms": {}}, **manifest})
        return dict(zip(table.what, table.value))["engine start"]

    assert engine_start({"studio": {"ticket": 1, "engine_start_s": 38.25}}) == "38.2 s"
    assert engine_start({"studio": {"ticket": 2}}) == "none: the engine was already running this layout"
    assert engine_start({}).startswith("not recorded")
