"""The reproduction report's writers: report.json, report.md and report.html, each written atomically."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from ..run_folder.atomic import write_atomic


def short(value: str | None, n: int = 16) -> str:
    return value[:n] if value else "-"


def fmt_ms(value: float | None) -> str:
    return f"{value:.1f}" if isinstance(value, (int, float)) else "-"


def timing_line(check: dict[str, Any]) -> str:
    head = f"{check['layout']} {check['gate_ms']} ms ({check['source']})"
    if check["checkable"]:
        return f"{head}: measured {fmt_ms(check['measured_ms'])} ms"
    return f"{head}: not checkable here ({'; '.join(check['why_not'])})"


def report_markdown(report: dict[str, Any]) -> str:
    ref = report["reference"]
    lines = [
        "# Reproduction report", "",
        f"- sample set: `{report['sample_set']['path']}` (seed {report['sample_set']['seed']}, "
        f"policy {report['sample_set']['seed_policy']})",
        f"- engine: {report['engine']}, layout: {report['layout']}",
        f"- reference: {ref['title'] + ' (' + str(ref['path']) + ')' if ref else 'none'}",
        "- summary: " + ", ".join(f"{k} {v}" for k, v in report["summary"].items()), "",
        "| sample | status | mode | seed | tier | steps | layout | frames sha256 | pcm sha256 | gate ms/step "
        "| verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["samples"]:
        lines.append(
            f"| {row['name']} | {row['status']} | {row['mode']} | {row['seed']} ({row['seed_source']}) | {row['tier']} "
            f"| {row['steps'] or '-'} | {row['layout']} | `{short(row['frames_sha256'])}` "
            f"| `{short(row['pcm_sha256'])}` "
            f"| {fmt_ms(row['gate_ms'])} | {row['verdict'] or '-'} |")
    details = [row for row in report["samples"] if row["error"] or row["verdict_notes"] or row["timing"]]
    if details:
        lines += ["", "## Details", ""]
        for row in details:
            for text in ([row["error"]] if row["error"] else []) + row["verdict_notes"] + [
                    timing_line(c) for c in row["timing"]]:
                lines.append(f"- **{row['name']}**: {text}")
    if report["cannot_check_here"]:
        lines += ["", "## What cannot be checked here", ""] + [f"- {note}" for note in report["cannot_check_here"]]
    return "\n".join(lines) + "\n"


def report_html(report: dict[str, Any]) -> str:
    e = html.escape
    ref = report["reference"]
    head = (f"<p>Sample set <code>{e(report['sample_set']['path'])}</code>, seed {report['sample_set']['seed']} "
            f"({e(report['sample_set']['seed_policy'])}); engine {e(report['engine'])}, layout {e(report['layout'])}; "
            f"reference {e(ref['title'] or '') + ' <code>' + e(str(ref['path'])) + '</code>' if ref else 'none'}.</p>"
            f"<p>{e(', '.join(f'{k} {v}' for k, v in report['summary'].items()))}</p>")
    rows = []
    for row in report["samples"]:
        poster = f'<img src="{e(row["poster"])}" width="160" alt="poster of {e(row["name"])}">' if row["poster"] else ""
        notes = [row["error"]] if row["error"] else []
        notes += row["verdict_notes"] + [timing_line(c) for c in row["timing"]]
        rows.append(
            "<tr>" + "".join(f"<td>{cell}</td>" for cell in (
                poster, e(row["name"]), e(row["status"]), e(row["mode"]), f"{row['seed']} ({e(row['seed_source'])})",
                e(row["tier"]), e(str(row["steps"] or "-")), e(row["layout"]),
                f"<code>{e(short(row['frames_sha256']))}</code>", f"<code>{e(short(row['pcm_sha256']))}</code>",
                e(fmt_ms(row["gate_ms"])), f'<b class="{e((row["verdict"] or "none").replace(" ", "-"))}">'
                f'{e(row["verdict"] or "-")}</b>', "<br>".join(e(n) for n in notes))) + "</tr>")
    cannot = "".join(f"<li>{e(note)}</li>" for note in report["cannot_check_here"])
    return (
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Reproduction report</title><style>"
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
        "padding:4px 8px;vertical-align:top}.identical{color:#070}.differs{color:#b00}</style></head><body>"
        f"<h1>Reproduction report</h1>{head}<table><tr><th>poster</th><th>sample</th><th>status</th><th>mode</th>"
        "<th>seed</th><th>tier</th><th>steps</th><th>layout</th><th>frames sha256</th><th>pcm sha256</th>"
        f"<th>gate ms/step</th><th>verdict</th><th>notes</th></tr>{''.join(rows)}</table>"
        + (f"<h2>What cannot be checked here</h2><ul>{cannot}</ul>" if cannot else "") + "</body></html>\n")


def write_reports(out: Path, report: dict[str, Any]) -> dict[str, Path]:
    paths = {"json": out / "report.json", "md": out / "report.md", "html": out / "report.html"}
    write_atomic(paths["json"], json.dumps(report, indent=2, default=str) + "\n")
    write_atomic(paths["md"], report_markdown(report))
    write_atomic(paths["html"], report_html(report))
    return paths
