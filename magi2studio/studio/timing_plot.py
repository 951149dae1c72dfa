"""The Results view's per-step timing plot, drawn as inline SVG: one panel per stage, a legend
that names every series, whole-number step ticks, tooltips rounded to 0.1 ms.

Drawn here rather than with gr.LinePlot: its legend showed only the colour field's title, its
step axis got half-step ticks at few steps, and one shared y axis let the 1080p refiner's few
(slow) steps flatten the preview's. Each stage gets its own panel and y axis, so a refiner
point neither vanishes nor stretches the preview's scale. Colours read in both themes; text
takes the page's colour.
"""

from __future__ import annotations

import html
import math

import pandas as pd

from ..engines.timing import EXCLUDED_STEPS

WIDTH, HEIGHT = 680, 230
LEFT, RIGHT, TOP, BOTTOM = 64, 14, 24, 40  # the top margin holds the labels of points above the axis
SLOWEST_COLOR = "#2563eb"
EXCLUDED_COLOR = "#6b7280"
RANK_COLORS = ("#d97706", "#059669", "#db2777", "#7c3aed", "#0891b2", "#65a30d", "#dc2626", "#a16207")
# Points more than this many times the slowest counted step (steps 0-1: warm-up, compile) are
# drawn at the panel's top edge, their value written beside them, so they cannot flatten the rest.
OUTLIER_FACTOR = 3.0
EMPTY = '<p class="m2s-plot-empty">No run yet: the per-step times appear here after a run.</p>'


def step_ticks(last: int, most: int = 11) -> list[int]:
    """Whole-number ticks from 0 to ``last``, at most ``most`` of them, spaced 1, 2, 5, 10, 20, 50..."""
    for size in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000):
        if last // size + 1 <= most:
            return list(range(0, last + 1, size))
    return [0, last]


def ms_ticks(top: float, most: int = 5) -> list[float]:
    """Round ticks from 0 covering ``top``: a step of 1, 2 or 5 times a power of ten."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / most
    power = 10 ** math.floor(math.log10(raw))
    size = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [i * size for i in range(int(math.ceil(top / size - 1e-9)) + 1)]


def _ms_label(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 or value == 0 else f"{value:.1f}"


DASH = 6  # a rank's dash; with n ranks each leaves (n - 1) dashes of gap for the others


def _style(kind: str, rank_index: int, ranks: int) -> dict[str, str]:
    """How a series is drawn (``ranks``: how many rank lines the panel has). The slowest rank is a wide pale
    band under the ranks: it runs along one of them at every step, so drawn on top (as before) it hid that
    rank. Ranks of equal times (CFG ranks wait for each other) lie on one line: rank i's dashes fill the
    gaps of the others (offset i dashes), so every rank's colour shows along it, where rank 1's line used
    to hide rank 0's."""
    if kind == "slowest":  # with one rank (no rank lines) it is that rank's line
        return {"color": SLOWEST_COLOR, "width": "7" if ranks else "2.5", "opacity": ".35" if ranks else "1",
                "dash": "", "offset": "0", "fill": SLOWEST_COLOR}
    if kind == "excluded":
        return {"color": EXCLUDED_COLOR, "width": "0", "opacity": "1", "dash": "", "offset": "0", "fill": "none"}
    color = RANK_COLORS[rank_index % len(RANK_COLORS)]
    return {"color": color, "width": "2", "opacity": "1", "dash": f"{DASH} {DASH * (ranks - 1)}",
            "offset": str(-DASH * rank_index), "fill": color}


# The slowest rank's band first (underneath), then the ranks, then the excluded steps on top.
_DRAW_ORDER = {"slowest": 0, "rank": 1, "excluded": 2}


def _panel(stage: str, frame: pd.DataFrame) -> str:
    last = int(frame.step.max())
    counted = frame[frame.kind == "slowest"]
    counted_top = float(counted.ms.max()) if len(counted) else float(frame.ms.max())
    top = float(frame.ms.max())
    clipped = top > OUTLIER_FACTOR * counted_top
    y_top = ms_ticks(counted_top * 1.1 if clipped else top * 1.05)[-1]
    inner_w, inner_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(step: float) -> float:
        return LEFT + (step + 0.5) / (last + 1) * inner_w

    def y(ms: float) -> float:
        return TOP + inner_h - min(ms, y_top) / y_top * inner_h

    parts = [f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" role="img" '
             f'aria-label="Per-step time of the {html.escape(stage)} stage, ms" class="m2s-plot-svg">']
    for tick in ms_ticks(y_top):
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
                     f'stroke="currentColor" stroke-opacity=".15"/>'
                     f'<text x="{LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{_ms_label(tick)}</text>')
    for tick in step_ticks(last):
        parts.append(f'<line x1="{x(tick):.1f}" x2="{x(tick):.1f}" y1="{TOP + inner_h}" y2="{TOP + inner_h + 4}" '
                     f'stroke="currentColor"/>'
                     f'<text x="{x(tick):.1f}" y="{TOP + inner_h + 17}" text-anchor="middle">{tick}</text>')
    parts.append(f'<text x="{LEFT + inner_w / 2:.0f}" y="{HEIGHT - 4}" text-anchor="middle">step</text>'
                 f'<text transform="translate(14 {TOP + inner_h / 2:.0f}) rotate(-90)" text-anchor="middle">'
                 f'ms per step</text>'
                 f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + inner_h}" stroke="currentColor" '
                 f'stroke-opacity=".4"/>')
    legend = []
    labelled: set[int] = set()  # one "above the axis" label per step, whichever series reaches it first
    kinds = dict(zip(frame.series, frame.kind))
    ranks = [name for name, kind in kinds.items() if kind == "rank"]
    for name in sorted(kinds, key=lambda n: (_DRAW_ORDER[kinds[n]], n)):
        style = _style(kinds[name], ranks.index(name) if name in ranks else 0, len(ranks))
        points = frame[frame.series == name].sort_values("step")
        label = html.escape(name)
        stroke = (f'stroke="{style["color"]}" stroke-width="{style["width"]}" stroke-opacity="{style["opacity"]}" '
                  f'stroke-dasharray="{style["dash"]}" stroke-dashoffset="{style["offset"]}"')
        if style["width"] != "0" and len(points) > 1:
            coords = " ".join(f"{x(s):.1f},{y(m):.1f}" for s, m in zip(points.step, points.ms))
            parts.append(f'<polyline points="{coords}" fill="none" {stroke}><title>{label}</title></polyline>')
        radius = 3.5 if last < 40 else 2.2
        for step, ms in zip(points.step, points.ms):
            over = ms > y_top and int(step) not in labelled
            # A rank's steps 0-1 are hollow too: filled under the excluded ring, they showed it filled.
            fill = "none" if int(step) in EXCLUDED_STEPS else style["fill"]
            parts.append(f'<circle cx="{x(step):.1f}" cy="{y(ms):.1f}" r="{radius}" fill="{fill}" '
                         f'stroke="{style["color"]}" stroke-width="1.5"><title>{label}, step {int(step)}: '
                         f'{ms:,.1f} ms</title></circle>')
            if over:
                labelled.add(int(step))
                parts.append(f'<text x="{x(step):.1f}" y="{TOP - 8}" text-anchor="middle" class="m2s-plot-over">'
                             f'▲ {ms:,.0f} ms</text>')
        swatch = (f'<svg width="28" height="10" aria-hidden="true"><line x1="0" x2="28" y1="5" y2="5" {stroke}/>'
                  f'<circle cx="14" cy="5" r="3.5" fill="{style["fill"]}" stroke="{style["color"]}" '
                  f'stroke-width="1.5"/></svg>')
        legend.append(f"<li>{swatch}<span>{label}</span></li>")
    parts.append("</svg>")
    title = f"{html.escape(stage)}: {last + 1} step{'s' if last else ''}"
    return (f'<figure class="m2s-plot-panel" data-stage="{html.escape(stage)}"><figcaption>{title}</figcaption>'
            f'{"".join(parts)}<ul class="m2s-plot-legend" aria-label="legend">{"".join(legend)}</ul></figure>')


def timing_html(frame: pd.DataFrame) -> str:
    """The plot for :func:`results.timing_frame`'s rows: a panel per stage (preview first)."""
    if frame.empty:
        return EMPTY
    stages = list(dict.fromkeys(frame.stage))
    return '<div class="m2s-plot">' + "".join(_panel(stage, frame[frame.stage == stage]) for stage in stages) + "</div>"
