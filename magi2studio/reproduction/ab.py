"""``ab``: the blog's paired method (MUSA report 2.1, 5.2): one request, control and candidate alternating.

Runs go C, K, C, K, ... for n pairs in one session. A side is env overrides, engine options,
request overrides and a layout. Every run is a fresh process (``python -m
magi2studio.reproduction.ab_run``) with the side's env in place before anything is imported, so an override
that is read at import time or at engine start (``MAGI2_KERNELS``, ``TORCHINDUCTOR_*``)
really reaches the engine, and each run starts its engine cold, as the blog launched each
side anew. Timing is compared only between runs whose outputs are bit-identical.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .ab_run import run_one_in_child, run_one_restarted
from ..run_folder.atomic import write_atomic
from ..errors import Cancelled, EngineError, InputError
from ..vocabulary.layouts import parse_layout
from ..vocabulary.request import Request, build_request
from ..run_folder.runs import check_outputs_root

REPORT_FORMAT = "magi2studio-ab-report/1"
SIDES = ("control", "candidate")
# process: a fresh interpreter per run (env read at import reaches the engine; ~45 s start
# each on the 2-core dev host under load). restart: this process, the side's env set and a
# new engine per run (only what the engine reads at start sees the env; ~0.5-0.8 s start).
ISOLATIONS = {"process": "a fresh process per run: env overrides are set before import, the engine starts cold",
              "restart": "one process, the side's env set and a new engine started for every run: env read at "
                         "engine start reaches it, env read at import time does not"}
MAX_PAIRS = 100
BIT_IDENTICAL = "bit-identical"


@dataclass(frozen=True)
class Side:
    """One arm of the comparison: everything that may differ between control and candidate."""

    label: str
    env: dict[str, str] = field(default_factory=dict)
    engine_options: dict[str, Any] = field(default_factory=dict)
    request_overrides: dict[str, Any] = field(default_factory=dict)
    layout: str = "sp1-cfg1"

    def describe(self) -> dict[str, Any]:
        return {"env": self.env, "engine_options": self.engine_options,
                "request_overrides": self.request_overrides, "layout": self.layout}


def parse_side(label: str, settings: list[str], default_layout: str) -> Side:
    """Read ``env.KEY=VALUE``, ``engine.KEY=VALUE``, ``request.FIELD=VALUE`` and ``layout=NAME``."""

    env: dict[str, str] = {}
    options: dict[str, Any] = {}
    overrides: dict[str, Any] = {}
    layout = default_layout
    for setting in settings:
        key, sep, value = setting.partition("=")
        kind, dot, name = key.partition(".")
        if not sep or (kind != "layout" and (not dot or not name)):
            raise InputError(label, f"{setting!r} is not a side setting",
                             "write env.KEY=VALUE, engine.KEY=VALUE, request.FIELD=VALUE or layout=NAME")
        if kind == "env":
            env[name] = value
        elif kind == "engine":
            options[name] = yaml.safe_load(value) if value else ""
        elif kind == "request":
            overrides[name] = yaml.safe_load(value) if value else ""
        elif kind == "layout" and not dot:
            layout = value
        else:
            raise InputError(label, f"{setting!r} starts with {kind!r}",
                             "start it with env., engine., request. or layout=")
    parse_layout(layout)
    return Side(label, env, options, overrides, layout)


def side_request(base: Request, side: Side) -> Request:
    try:
        return build_request(**{**base.model_dump(), **side.request_overrides})
    except InputError as err:
        raise InputError(f"{side.label}.request.{err.field}", err.problem, err.fix) from None


@dataclass
class AbRun:
    order: int
    pair: int
    side: str
    status: str = "pending"  # pending | ok | failed | cancelled
    run_name: str | None = None
    frames_sha256: str | None = None
    pcm_sha256: str | None = None
    gate_ms: float | None = None
    engine_start_ms: float | None = None
    wall_s: float | None = None
    error: str | None = None

    @property
    def hashes(self) -> tuple[str | None, str | None]:
        return self.frames_sha256, self.pcm_sha256


EventCallback = Callable[[str, AbRun, Any], None]


def check_pairs(pairs: int) -> int:
    if isinstance(pairs, bool) or not isinstance(pairs, int) or not 1 <= pairs <= MAX_PAIRS:
        raise InputError("pairs", f"{pairs!r} is not a usable pair count", f"use a whole number from 1 to {MAX_PAIRS}")
    return pairs


def plan(sides: tuple[Side, Side], pairs: int) -> list[AbRun]:
    """C, K, C, K, ...: each pair runs its control first, in one session."""

    return [AbRun(order=2 * pair + k, pair=pair, side=sides[k].label) for pair in range(pairs) for k in (0, 1)]


def compare(runs: list[AbRun]) -> dict[str, Any]:
    """The identity verdict across all runs, then ratios of the pairs whose outputs match."""

    done = [r for r in runs if r.status == "ok"]
    first = done[0].hashes if done else None
    differing = [r for r in done if r.hashes != first]
    incomplete = [r for r in runs if r.status != "ok"]
    if done and not differing and not incomplete:
        identity = {"verdict": BIT_IDENTICAL, "hashes": {"frames_sha256": first[0], "pcm_sha256": first[1]}}
    else:
        groups: dict[str, list[str]] = {}
        for r in done:
            groups.setdefault(f"{r.frames_sha256[:16]}/{r.pcm_sha256[:16]}", []).append(f"{r.side}#{r.pair + 1}")
        identity = {"verdict": "differs" if differing else "incomplete", "groups": groups,
                    "differ_from_first": [f"{r.side}#{r.pair + 1}" for r in differing],
                    "not_completed": [f"{r.side}#{r.pair + 1}" for r in incomplete]}
    pairs, excluded = [], []
    for pair in sorted({r.pair for r in runs}):
        control, candidate = (next(r for r in runs if r.pair == pair and r.side == side) for side in SIDES)
        label = f"pair {pair + 1}"
        if control.status != "ok" or candidate.status != "ok":
            excluded.append(f"{label}: a run did not complete")
        elif control.hashes != candidate.hashes:
            excluded.append(f"{label}: outputs differ, so its times are not compared (MUSA report 2.1)")
        elif control.gate_ms is None or candidate.gate_ms is None:
            excluded.append(f"{label}: no gate metric (it needs at least 3 steps: steps 0 and 1 are dropped)")
        else:
            pairs.append({"pair": pair + 1, "control_ms": control.gate_ms, "candidate_ms": candidate.gate_ms,
                          "ratio": candidate.gate_ms / control.gate_ms})
    ratios = [p["ratio"] for p in pairs]
    timing: dict[str, Any] = {"pairs": pairs, "excluded": excluded}
    if ratios:
        median = statistics.median(ratios)
        timing.update(median_ratio=median, min_ratio=min(ratios), max_ratio=max(ratios),
                      spread_pct=(max(ratios) - min(ratios)) / median * 100, compared_pairs=len(ratios),
                      control_median_ms=statistics.median(p["control_ms"] for p in pairs),
                      candidate_median_ms=statistics.median(p["candidate_ms"] for p in pairs),
                      stdev_ratio=statistics.stdev(ratios) if len(ratios) > 1 else None)
    else:
        timing["note"] = "no pair could be compared for time: " + ("; ".join(excluded) or "nothing ran")
    return {"identity": identity, "timing": timing}


def run_ab(base: Request, sides: tuple[Side, Side], pairs: int, *, engine_name: str, out: Path,
           isolation: str = "process", on_event: EventCallback | None = None,
           cancel: threading.Event | None = None) -> dict[str, Any]:
    """Validate everything, run the pairs, write ``ab.json`` and ``ab.md``; return the report."""

    from ..engines import get_engine

    check_pairs(pairs)
    if isolation not in ISOLATIONS:
        raise InputError("isolation", f"unknown isolation {isolation!r}", f"use {' or '.join(ISOLATIONS)}")
    run_one = run_one_in_child if isolation == "process" else run_one_restarted
    requests = {side.label: side_request(base, side) for side in sides}
    for side in sides:
        engine = get_engine(engine_name, **side.engine_options)
        engine.plan(requests[side.label], parse_layout(side.layout))
    out = check_outputs_root(Path(out))
    runs_root = check_outputs_root(out / "runs")
    by_label = {side.label: side for side in sides}
    runs = plan(sides, pairs)
    emit = on_event or (lambda kind, run, payload: None)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    for run in runs:
        side = by_label[run.side]
        spec = {"request": requests[run.side].model_dump(mode="json"), "layout": side.layout, "engine": engine_name,
                "engine_options": side.engine_options, "out": str(runs_root),
                "extra": {"ab": {"side": run.side, "pair": run.pair + 1, "order": run.order + 1,
                                 "env_overrides": side.env, "engine_options": side.engine_options}}}
        emit("start", run, None)
        t0 = time.perf_counter()
        try:
            result = run_one(spec, side.env, lambda line: emit("progress", run, line), cancel)
        except Cancelled:
            for left in runs[run.order:]:
                left.status = "cancelled"
            write_ab_reports(out, build_report(base, sides, pairs, engine_name, isolation, runs, started))
            raise
        except EngineError as err:
            run.status, run.error = "failed", str(err)
        else:
            run.status, run.run_name = "ok", result["run"]
            run.frames_sha256, run.pcm_sha256 = result["hashes"]["frames_sha256"], result["hashes"]["pcm_sha256"]
            run.gate_ms, run.engine_start_ms = result["gate_ms"], result["engine_start_ms"]
        run.wall_s = time.perf_counter() - t0
        emit("done", run, None)
        write_ab_reports(out, build_report(base, sides, pairs, engine_name, isolation, runs, started))
    return build_report(base, sides, pairs, engine_name, isolation, runs, started)


def build_report(base: Request, sides: tuple[Side, Side], pairs: int, engine_name: str, isolation: str,
                 runs: list[AbRun], started: str) -> dict[str, Any]:
    return {
        "format": REPORT_FORMAT,
        "started": started,
        "engine": engine_name,
        "isolation": {"mode": isolation, "what_it_means": ISOLATIONS[isolation]},
        "request": base.model_dump(mode="json"),
        "pairs": pairs,
        "sides": {side.label: side.describe() for side in sides},
        "runs": [dict(vars(r)) for r in runs],
        **compare(runs),
    }


def report_markdown(report: dict[str, Any]) -> str:
    request, identity, timing = report["request"], report["identity"], report["timing"]
    lines = ["# A/B report", "",
             f"- request: {request['mode']} {request['tier']} seed {request['seed']} "
             f"steps {request['steps'] or 'default'}"
             f", engine {report['engine']}, {report['pairs']} pairs, order C, K, C, K, ...",
             f"- isolation: {report['isolation']['mode']} ({report['isolation']['what_it_means']})"]
    for label, side in report["sides"].items():
        lines.append(f"- {label}: layout {side['layout']}, env {side['env'] or '{}'}, engine options "
                     f"{side['engine_options'] or '{}'}, request overrides {side['request_overrides'] or '{}'}")
    lines += ["", "| # | side | pair | status | gate ms/step | engine start ms | run wall s | frames sha256 "
                  "| pcm sha256 |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        lines.append(f"| {r['order'] + 1} | {r['side']} | {r['pair'] + 1} | {r['status']} | {fmt(r['gate_ms'])} "
                     f"| {fmt(r['engine_start_ms'])} | {fmt(r['wall_s'], 2)} | `{(r['frames_sha256'] or '-')[:16]}` "
                     f"| `{(r['pcm_sha256'] or '-')[:16]}` |" + (f" {r['error']}" if r["error"] else ""))
    lines += ["", f"**Outputs: {identity['verdict']}**"]
    if identity["verdict"] != BIT_IDENTICAL:
        lines += [f"- {group}: {', '.join(names)}" for group, names in identity.get("groups", {}).items()]
        if identity.get("not_completed"):
            lines.append(f"- not completed: {', '.join(identity['not_completed'])}")
    lines += ["", "| pair | control ms | candidate ms | candidate/control |", "|---|---|---|---|"]
    lines += [f"| {p['pair']} | {fmt(p['control_ms'])} | {fmt(p['candidate_ms'])} | {p['ratio']:.4f} |"
              for p in timing["pairs"]]
    if "median_ratio" in timing:
        lines += ["", f"**candidate/control: median {timing['median_ratio']:.4f}, range {timing['min_ratio']:.4f}"
                      f"-{timing['max_ratio']:.4f} (spread {timing['spread_pct']:.2f}% of the median) over "
                      f"{timing['compared_pairs']} pairs**"]
    else:
        lines += ["", f"**{timing['note']}**"]
    lines += [f"- excluded {text}" for text in timing["excluded"]]
    return "\n".join(lines) + "\n"


def fmt(value: float | None, digits: int = 1) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else "-"


def write_ab_reports(out: Path, report: dict[str, Any]) -> dict[str, Path]:
    paths = {"json": out / "ab.json", "md": out / "ab.md"}
    write_atomic(paths["json"], json.dumps(report, indent=2, default=str) + "\n")
    write_atomic(paths["md"], report_markdown(report))
    return paths
