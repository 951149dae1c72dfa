"""What the Results view shows for one run folder, as plain data (DataFrames, rows, a zip)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pandas as pd

from ..vocabulary.request import RANDOM_SEED
from ..run_folder.runs import RunFolder
from ..engines.timing import EXCLUDED_STEPS, read_jsonl, slowest_rank_per_step

TIMING_COLUMNS = ["step", "ms", "series", "stage", "kind"]


def timing_frame(records: list[dict]) -> pd.DataFrame:
    """Per-step times for the plot: the slowest rank per step, each rank, and the excluded steps.

    Steps 0 and 1 get their own series so the plot shows them apart from what the metric uses;
    ``kind`` is ``slowest``, ``rank`` or ``excluded`` (how the plot draws the series).
    """
    rows: list[dict[str, Any]] = []
    stages = sorted({r["stage"] for r in records}, key=lambda s: (s != "preview", s))
    for stage in stages:
        ranks = sorted({r["rank"] for r in records if r["stage"] == stage})
        # With one rank its line is the slowest-rank line; drawing both would hide one.
        slowest_name = f"{stage} slowest rank" if len(ranks) > 1 else f"{stage} rank {ranks[0]} (the only rank)"
        for step, ms in slowest_rank_per_step(records, stage).items():
            excluded = step in EXCLUDED_STEPS
            series = f"{stage} steps 0-1 (excluded)" if excluded else slowest_name
            rows.append({"step": step, "ms": ms, "series": series, "stage": stage,
                         "kind": "excluded" if excluded else "slowest"})
        if len(ranks) > 1:
            for record in records:
                if record["stage"] == stage:
                    rows.append({"step": record["step"], "ms": float(record["ms"]),
                                 "series": f"{stage} rank {record['rank']}", "stage": stage, "kind": "rank"})
    return pd.DataFrame(rows, columns=TIMING_COLUMNS)


def _ms(value: float | None) -> str:
    """A time in the unit a person reads it in: ms under a second, s under two minutes, then min and s."""
    if value is None:
        return "n/a"
    if value < 1000:
        return f"{value:.1f} ms"
    seconds = value / 1000
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min ({seconds:.0f} s)"


def engine_start_text(manifest: dict[str, Any]) -> str:
    """The engine start this run waited for: the queue runner records it in the manifest's ``studio`` block
    when it started the engine for the job (the run's own stages begin after it)."""
    studio = manifest.get("studio")
    if studio is None:
        return "not recorded (run outside the studio's queue)"
    if studio.get("engine_start_s") is None:
        return "none: the engine was already running this layout"
    return _ms(studio["engine_start_s"] * 1000)


def summary_frame(manifest: dict[str, Any]) -> pd.DataFrame:
    """The engine start, the gate metric (ms/step) with median / min / max and totals per stage, then stage times."""
    rows: list[tuple[str, str]] = [("engine start", engine_start_text(manifest))] if manifest else []
    timing = manifest.get("timing", {})
    for stage, summary in timing.get("stages", {}).items():
        rows.append((f"{stage} gate metric (slowest rank, steps 0-1 dropped)",
                     _ms(summary.get("gate_ms")) + "/step" if summary.get("gate_ms") is not None
                     else summary.get("note", "n/a")))
        rows.append((f"{stage} median / min / max",
                     " / ".join(_ms(summary.get(key)) for key in ("median_ms", "min_ms", "max_ms"))))
        rows.append((f"{stage} steps, ranks", f"{summary.get('steps')} steps on ranks {summary.get('ranks')}"))
        rows.append((f"{stage} total", _ms(summary.get("total_ms"))))
    for stage, ms in timing.get("stage_ms", {}).items():
        rows.append((f"stage {stage}", _ms(ms)))
    return pd.DataFrame(rows, columns=["what", "value"])


def headline(run: RunFolder) -> str:
    """One line naming the run: mode, tier, the seed actually used, steps, layout, hashes."""
    m = run.manifest
    request, resolved, output = m["request"], m.get("resolved", {}), m.get("output", {})
    steps = resolved.get("steps", request.get("steps"))
    drawn = " (drawn at random: -1 was asked)" if resolved.get("seed_asked") == RANDOM_SEED else ""
    return (f"**{run.path.name}** · {request['mode'].upper()} {request['tier']} · seed **{request['seed']}**{drawn} · "
            f"{steps} steps · layout {m['layout']['name']} · {output.get('width')}x{output.get('height')} "
            f"{output.get('frames')} frames @ {output.get('fps')} fps · frames sha256 "
            f"`{m['hashes']['frames_sha256'][:16]}…`")


def load_timing(run: RunFolder) -> pd.DataFrame:
    return timing_frame(read_jsonl(run.steps))


def zip_run(run: RunFolder, scratch: Path) -> Path:
    """A zip of the whole run folder, made once per run in the studio's scratch folder."""
    target = Path(scratch) / f"{run.path.name}.zip"
    if not target.is_file():
        partial = shutil.make_archive(str(Path(scratch) / f".{run.path.name}"), "zip",
                                      root_dir=run.path.parent, base_dir=run.path.name)
        Path(partial).rename(target)
    return target
