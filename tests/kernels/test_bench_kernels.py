"""scripts/bench_kernels.py's pass rules: any failed check or section makes the run fail (exit 1)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_kernels.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_kernels", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_judge_fails_on_a_bound_or_a_false_equality(bench):
    assert bench.judge(dict(check="moe_x", ours_det_rel_err=3e-3, deterministic_bit_identical=True))["passed"]
    bad = bench.judge(dict(check="moe_x", ours_det_rel_err=2e-2, deterministic_bit_identical=False))
    assert not bad["passed"] and set(bad["failed"]) == {"ours_det_rel_err", "deterministic_bit_identical"}
    assert not bench.judge(dict(check="moe_x", ours_det_rel_err=float("inf")))["passed"]
    assert not bench.judge(dict(check="mhc_projection", rel_err=2e-5))["passed"]  # its own, tighter bound


def test_default_out_is_outside_the_checkout(bench):
    assert not Path(bench.default_out_dir()).resolve().is_relative_to(SCRIPT.parents[1])


def test_a_missing_upstream_site_is_refused_by_name(bench, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sys, "argv", ["bench_kernels.py", "--upstream-site", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_info:
        bench.main()
    assert exit_info.value.code == 2
    assert "--upstream-site:" in capsys.readouterr().err


@pytest.mark.parametrize("name, slug", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                        ("NVIDIA H200 NVL", "h200"), ("MTT S5000", "s5000"), ("cpu", "cpu")])
def test_the_output_file_and_every_row_name_the_card_that_ran(bench, name, slug):
    """Round 2's bench wrote an H100 run as kernels-h200-<date>.json."""

    assert bench.card_slug(name) == slug
    results = dict(device=name, rows=[{"label": "a"}], mhc=[{"label": "b"}], attention_sink=[{}])
    bench.stamp_rows(results)
    assert all(row["device"] == name for section in ("rows", "mhc", "attention_sink") for row in results[section])


def test_a_run_names_its_card_in_the_file_name_and_every_row(bench, monkeypatch, tmp_path):
    """main() itself, on this CPU with the device faked as an H100: the file name and every row of every section
    (MoE shapes, mHC, sink, variants, the sweep's candidates, checks) name it. The measuring is stood in for."""
    import datetime

    import vllm_omni

    def moe(args, mh, dev, smoke, results, checks, save):
        results["rows"].append({"label": "272p", "routing": {}})
        results["variants"] = [{"variant": "default", "ms": 1.0}]
        results["sweep"] = {"routing": "balanced", "candidates": [{"kernel": "w13", "ms": 1.0}]}
        checks.append({"check": "moe_x", "ours_det_rel_err": 3e-3, "deterministic_bit_identical": True})
        save()

    monkeypatch.setattr(bench, "device_name", lambda dev: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(bench, "run_moe", moe)
    monkeypatch.setattr(bench, "run_mhc", lambda mhc_up, dev, smoke, results, checks: results["mhc"].append({}))
    monkeypatch.setattr(bench, "run_sink", lambda dev, smoke, results, checks: results["attention_sink"].append({}))
    site = Path(vllm_omni.__file__).parents[1]
    monkeypatch.setattr(sys, "argv", ["bench_kernels.py", "--upstream-site", str(site), "--out", str(tmp_path)])
    # main()'s load_upstream swaps stand-ins into sys.modules for vllm and vllm_omni; every later test would import
    # those (test_plugin failed on 'No module named ...sampler_magi2' after this test), so they are put back.
    saved = dict(sys.modules)
    try:
        bench.main()
    finally:
        for name in set(sys.modules) - set(saved):
            del sys.modules[name]
        sys.modules.update(saved)
    written = list(tmp_path.glob("*.json"))
    assert [path.name for path in written] == [f"kernels-h100-smoke-{datetime.date.today().isoformat()}.json"]
    results = json.loads(written[0].read_text())
    rows = [row for rows in results.values() if isinstance(rows, list) for row in rows]
    rows += results["sweep"]["candidates"]
    assert len(rows) == 6 and all(row["device"] == "NVIDIA H100 80GB HBM3" for row in rows), rows


def test_the_mhc_sweep_times_checks_and_compares_bits_per_config(bench):
    """--mhc-sweep's rows under the interpreter (two Sinkhorn configs, one projection config per split):
    each carries its time, its error against fp64 and whether five calls gave the same bits, so a config
    that breaks either shows."""

    results = dict(copy_bytes_per_ms=1e9)
    bench.run_mhc_sweep("cpu", True, results)
    rows = results["mhc_sweep"]
    assert [row["kernel"] for row in rows] == ["sinkhorn"] * 2 + ["projection"] * 3
    assert [row["split"] for row in rows[2:]] == ["none", "tf32", "bf16"]
    for row in rows:
        assert "error" not in row and row["ms"] > 0 and row["bit_identical"] is True
    assert all(row["residual_rel_err"] < 1e-2 for row in rows[:2])  # fp16 outputs under --smoke
    assert all(row["rel_err"] < 1e-5 for row in rows[2:])
