"""``magi2studio ab`` end to end on the embedded engine: identical sides, a fresh process per run."""

from __future__ import annotations

import json
import os
import statistics
import warnings

import pytest

from magi2studio.cli import main
from magi2studio.engines.timing import gate_summary, read_jsonl

PROMPT = "A red kite over a windy beach; waves, gulls and the snap of the kite's fabric."


def run_folders_of(out, report):
    return [out / "runs" / run["run_name"] for run in report["runs"]]


@pytest.mark.slow
def test_identical_sides_are_bit_identical_with_a_ratio_near_one(tmp_path, monkeypatch):
    out, cache = tmp_path / "ab", tmp_path / "inductor-cache"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    same = f"env.TORCHINDUCTOR_CACHE_DIR={cache}"
    load_before = os.getloadavg()[0]
    status = main(["ab", "--prompt", PROMPT, "--steps", "5", "--pairs", "2", "--isolation", "restart",
                   "--out", str(out), "--control", same, "--candidate", same])
    assert status == 0
    report = json.loads((out / "ab.json").read_text())
    assert [(r["side"], r["pair"], r["status"]) for r in report["runs"]] == [
        ("control", 0, "ok"), ("candidate", 0, "ok"), ("control", 1, "ok"), ("candidate", 1, "ok")]
    assert report["identity"]["verdict"] == "bit-identical"
    gates = {}
    for run, folder in zip(report["runs"], run_folders_of(out, report)):
        manifest = json.loads((folder / "manifest.json").read_text())
        assert manifest["environment"]["TORCHINDUCTOR_CACHE_DIR"] == str(cache)  # the override was in force
        assert manifest["ab"]["side"] == run["side"] and manifest["ab"]["pair"] == run["pair"] + 1
        gates[(run["pair"], run["side"])] = gate_summary(read_jsonl(folder / "steps.jsonl"))["gate_ms"]
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ  # and put back after each run
    ratios = [gates[(p, "candidate")] / gates[(p, "control")] for p in (0, 1)]
    timing = report["timing"]
    assert [p["ratio"] for p in timing["pairs"]] == pytest.approx(ratios)
    assert timing["median_ratio"] == pytest.approx(statistics.median(ratios))
    assert timing["spread_pct"] == pytest.approx((max(ratios) - min(ratios)) / statistics.median(ratios) * 100)
    # Same code, same request: only machine noise separates the sides. On an oversubscribed
    # host single steps were seen to vary 10x (300 ms to 5 s), so the closeness to 1 is only
    # asserted when the host was not oversubscribed during the runs.
    assert timing["median_ratio"] > 0 and timing["spread_pct"] >= 0
    load_per_core = max(load_before, os.getloadavg()[0]) / (os.cpu_count() or 1)
    if load_per_core < 1.5:
        assert 0.5 < timing["median_ratio"] < 2.0, f"identical sides differ in time (load {load_per_core:.1f}/core)"
    else:
        warnings.warn(f"load {load_per_core:.1f} per core: the ratio {timing['median_ratio']:.2f} was not held to ~1")
    markdown = (out / "ab.md").read_text()
    assert "**Outputs: bit-identical**" in markdown and "candidate/control: median" in markdown


@pytest.mark.slow
def test_a_fresh_process_per_run_gets_the_sides_env(tmp_path, monkeypatch):
    out = tmp_path / "ab"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    sides = ["--control", f"env.TORCHINDUCTOR_CACHE_DIR={tmp_path / 'c'}",
             "--candidate", f"env.TORCHINDUCTOR_CACHE_DIR={tmp_path / 'k'}"]
    assert main(["ab", "--prompt", PROMPT, "--steps", "3", "--pairs", "1", "--out", str(out), *sides]) == 0
    report = json.loads((out / "ab.json").read_text())
    assert report["isolation"]["mode"] == "process" and report["identity"]["verdict"] == "bit-identical"
    recorded = [json.loads((f / "manifest.json").read_text())["environment"]["TORCHINDUCTOR_CACHE_DIR"]
                for f in run_folders_of(out, report)]
    assert recorded == [str(tmp_path / "c"), str(tmp_path / "k")]
    assert len(report["timing"]["pairs"]) == 1


@pytest.mark.parametrize("argv, field", [
    (["--pairs", "0"], "pairs"),
    (["--pairs", "-2"], "pairs"),
    (["--pairs", "two"], "pairs"),
    (["--control", "MAGI2_KERNELS=on"], "control"),
    (["--candidate", "layout=sp8-cfg1-ep4"], "layout"),
    (["--candidate", "request.tier=4k"], "candidate.request.tier"),
    (["--isolation", "thread"], None),
])
def test_bad_ab_input_exits_2_before_any_run(tmp_path, capsys, argv, field):
    out = tmp_path / "ab"
    if field is None:  # refused by argparse itself
        with pytest.raises(SystemExit) as caught:
            main(["ab", "--prompt", PROMPT, "--steps", "3", "--out", str(out), *argv])
        assert caught.value.code == 2
    else:
        assert main(["ab", "--prompt", PROMPT, "--steps", "3", "--out", str(out), *argv]) == 2
        assert capsys.readouterr().err.startswith(f"error: {field}: ")
    assert not out.exists()
