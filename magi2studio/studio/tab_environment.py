"""Environment: what ``magi2studio doctor`` reports (platform, devices, versions, the
deterministic environment, the weights check). Until the doctor module is installed, the
engine's capabilities, package versions, the deterministic environment and build-info."""

from __future__ import annotations

import dataclasses
import importlib
import logging
from typing import Any

import gradio as gr

from .. import determinism, provenance
from .context import StudioContext

log = logging.getLogger(__name__)
TAB_ID = "environment"


def environment_report(ctx: StudioContext) -> dict[str, Any]:
    """The doctor's report when ``magi2studio.doctor.report`` exists, else what the spine records."""
    try:
        doctor = importlib.import_module("magi2studio.doctor")
    except ModuleNotFoundError:
        doctor = None
    if doctor is not None and hasattr(doctor, "report"):
        found = doctor.report()
        if dataclasses.is_dataclass(found):
            found = dataclasses.asdict(found)
        return {"source": "magi2studio doctor", **(found if isinstance(found, dict) else {"report": found})}
    return {
        "source": "studio (magi2studio.doctor is not installed)",
        "engine": dataclasses.asdict(ctx.capabilities),
        "versions": provenance.package_versions(),
        "deterministic_environment": determinism.recorded(),
        "build_info": provenance.build_info(),
    }


def _summary(report: dict[str, Any]) -> str:
    engine = report.get("engine", {})
    if isinstance(engine, dict) and "platform" in engine:
        lines = [f"**Engine** {engine.get('engine')} on **{engine.get('platform')}**, devices: "
                 f"{', '.join(engine.get('devices') or []) or 'none'}"]
    else:
        lines = []
    lines.append(f"Report from: {report.get('source')}")
    env = report.get("deterministic_environment") or {}
    unset = [key for key, value in env.items() if value is None]
    if env:
        lines.append("Deterministic environment: " + ("all set" if not unset else f"not set: {', '.join(unset)}"))
    return "\n\n".join(lines)


def build(ctx: StudioContext) -> None:
    with gr.Tab("Environment", id=TAB_ID) as tab:
        refresh = gr.Button("Refresh", size="sm")
        summary = gr.Markdown()
        report = gr.JSON(label="Environment report", elem_id="environment-report")

    def load():
        try:
            found = environment_report(ctx)
        except Exception as err:  # a broken probe must not take the page down
            log.exception("environment report failed")
            raise gr.Error(f"the environment report failed: {type(err).__name__}: {err}",
                           print_exception=False) from None
        return _summary(found), found

    for trigger in (tab.select, refresh.click):
        trigger(load, None, [summary, report], api_visibility="private")
