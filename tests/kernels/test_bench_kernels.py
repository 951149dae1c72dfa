"""scripts/bench_kernels.py's pass rules: any failed check or section makes the run fail (exit 1)."""

from __future__ import annotations

import importlib.util
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
