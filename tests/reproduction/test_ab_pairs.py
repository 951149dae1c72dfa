"""A/B sides, pair order and the comparison rules, without running an engine."""

from __future__ import annotations

import pytest

from magi2studio.reproduction.ab import BIT_IDENTICAL, AbRun, Side, check_pairs, compare, parse_side, plan, side_request
from magi2studio.errors import InputError
from magi2studio.vocabulary.request import build_request


def test_sides_parse_env_engine_request_and_layout_settings():
    side = parse_side("candidate", ["env.MAGI2_KERNELS=on", "engine.checkpoint_root=/x", "request.compile=dynamic",
                                    "layout=sp8-cfg1-ep8"], "sp8-cfg1-ep4")
    assert side == Side("candidate", {"MAGI2_KERNELS": "on"}, {"checkpoint_root": "/x"}, {"compile": "dynamic"},
                        "sp8-cfg1-ep8")
    assert side_request(build_request(prompt="p"), side).compile == "dynamic"


@pytest.mark.parametrize("setting", ["MAGI2_KERNELS=on", "env.=x", "gpu.x=1", "layout=sp3", "envMAGI2"])
def test_bad_side_settings_are_refused(setting):
    with pytest.raises(InputError):
        parse_side("control", [setting], "sp1-cfg1")


def test_a_side_request_override_is_validated():
    with pytest.raises(InputError) as caught:
        side_request(build_request(prompt="p"), parse_side("control", ["request.steps=0"], "sp1-cfg1"))
    assert caught.value.field == "control.request.steps"


@pytest.mark.parametrize("pairs", [0, -1, True, 101, None])
def test_pair_counts_out_of_range_are_refused(pairs):
    with pytest.raises(InputError) as caught:
        check_pairs(pairs)
    assert caught.value.field == "pairs"


def test_runs_alternate_control_then_candidate():
    sides = (Side("control"), Side("candidate"))
    assert [(r.side, r.pair) for r in plan(sides, 3)] == [
        ("control", 0), ("candidate", 0), ("control", 1), ("candidate", 1), ("control", 2), ("candidate", 2)]


def done(order, pair, side, frames, ms):
    return AbRun(order, pair, side, "ok", f"run{order}", frames * 4, "p" * 64, ms)


def test_identical_runs_give_pair_ratios_median_and_spread():
    runs = [done(0, 0, "control", "a", 100.0), done(1, 0, "candidate", "a", 90.0),
            done(2, 1, "control", "a", 100.0), done(3, 1, "candidate", "a", 80.0),
            done(4, 2, "control", "a", 100.0), done(5, 2, "candidate", "a", 85.0)]
    result = compare(runs)
    assert result["identity"]["verdict"] == BIT_IDENTICAL
    timing = result["timing"]
    assert [p["ratio"] for p in timing["pairs"]] == [0.9, 0.8, 0.85]
    assert timing["median_ratio"] == 0.85 and timing["min_ratio"] == 0.8 and timing["max_ratio"] == 0.9
    assert timing["spread_pct"] == pytest.approx(0.1 / 0.85 * 100)


def test_a_pair_whose_outputs_differ_is_not_timed_and_the_verdict_names_it():
    runs = [done(0, 0, "control", "a", 100.0), done(1, 0, "candidate", "b", 50.0),
            done(2, 1, "control", "a", 100.0), done(3, 1, "candidate", "a", 95.0)]
    result = compare(runs)
    assert result["identity"]["verdict"] == "differs"
    assert result["identity"]["differ_from_first"] == ["candidate#1"]
    assert [p["pair"] for p in result["timing"]["pairs"]] == [2]
    assert "outputs differ" in result["timing"]["excluded"][0]


def test_no_comparable_pair_says_so():
    runs = [done(0, 0, "control", "a", 100.0), AbRun(1, 0, "candidate", "failed", error="boom")]
    result = compare(runs)
    assert result["identity"]["verdict"] == "incomplete"
    assert "median_ratio" not in result["timing"] and "did not complete" in result["timing"]["note"]
