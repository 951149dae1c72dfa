"""The studio app: one Blocks with the tabs in :data:`TABS`, sharing one engine slot.

A tab is a module ``magi2studio.studio.tab_<name>`` exposing ``build(ctx)``; add it to
``TABS`` to include it (see :class:`~magi2studio.studio.context.StudioContext` for ``ctx``).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import gradio as gr
from starlette.middleware import Middleware

from ..engines.base import Engine
from ..vocabulary.layouts import parse_layout
from ..run_folder.runs import check_outputs_root
from . import health
from .context import ASSETS, MAX_UPLOAD_BYTES, StudioContext
from .door import RepeatedAnswers
from .served import ServedFiles, StudioBlocks
from .slot import EngineSlot

TABS = ("generate", "results", "history", "environment", "reproduce", "ab")
TITLE = "MAGI-2 studio"


def create_app(engine: Engine, outputs_root: Path, *, max_waiting: int = 32, preload: str | None = None,
               gpu_gib: float = 80.0) -> tuple[gr.Blocks, StudioContext]:
    """Build the app around ``engine``; ``preload`` starts the engine for a layout at once."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    outputs_root = check_outputs_root(Path(outputs_root)).resolve()
    capabilities = engine.capabilities()
    slot = EngineSlot(engine, outputs_root, max_waiting=max_waiting,
                      preload=parse_layout(preload) if preload else None)
    ctx = StudioContext(engine=engine, capabilities=capabilities, slot=slot, outputs_root=outputs_root,
                        gpu_gib=gpu_gib)
    with StudioBlocks(title=TITLE, analytics_enabled=False) as demo:
        demo.served = ServedFiles(outputs_root)  # the linked reports, not the root: it holds the queue file
        ctx.demo = demo
        gr.Markdown(f"# {TITLE} · {capabilities.engine} engine")
        with gr.Tabs(overflow_behavior="wrap") as tabs:  # on a phone every tab stays in sight, not in a "⋯" menu
            ctx.tabs = tabs
            for name in TABS:
                importlib.import_module(f"magi2studio.studio.tab_{name}").build(ctx)
        ctx.run_deferred()
    demo.queue(default_concurrency_limit=4)
    return demo, ctx


def theme() -> gr.themes.Base:
    """Gradio's Soft theme with text that meets WCAG AA (4.5:1) in both themes; as measured in Chromium,
    Soft's label chips were 3.63:1, placeholders 2.54:1, and info text and the footer 2.43:1 in the light theme."""
    return gr.themes.Soft().set(
        block_label_text_color="*primary_700", block_title_text_color="*primary_700",
        input_placeholder_color="*neutral_500", input_placeholder_color_dark="*neutral_300",
        body_text_color_subdued="*neutral_600",
    )


def launch_options(ctx: StudioContext, *, auth: tuple[str, str] | None = None) -> dict[str, Any]:
    """Keyword arguments for ``demo.launch``: served paths, theme and CSS, threads, login, the door's answers."""
    disabled = [tier for tier, reason in ctx.capabilities.tiers.items() if reason]
    css = (ASSETS / "studio.css").read_text(encoding="utf-8") + "".join(
        f'\n#tier label:has(input[value="{tier}"]) {{ opacity: .45; pointer-events: none; }}' for tier in disabled)
    return {
        # The linked reports are added per look-up by StudioBlocks (served.py), never the whole outputs root.
        "allowed_paths": [str(ASSETS)],
        "css": css,
        "theme": theme(),
        # Waiting followers each hold a worker thread; leave room for the page's other events.
        "max_threads": ctx.slot.max_waiting + 24,
        "auth": auth,
        "max_file_size": MAX_UPLOAD_BYTES,
        # Gradio's browser-side run history (its footer "Runs" page) cannot show this app's outputs
        # (it printed "[object Object]" and raw update dicts); History is the record here.
        "run_history": False,
        "js": (ASSETS / "studio.js").read_text(encoding="utf-8"),
        # /health/live and /health/ready, ahead of Gradio's routes (health.py). A crowd of gradio_client
        # clients each fetch the config and API info first (door.py); with a login, each answer depends
        # on a session that can end, so Gradio answers every one.
        "app_kwargs": {"routes": health.routes(ctx),
                       "middleware": [] if auth else [Middleware(RepeatedAnswers, blocks=ctx.demo)]},
    }
