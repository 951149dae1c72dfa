"""History: past run folders, newest first, with poster thumbnails; picking one shows its results."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from ..errors import InputError
from ..runs import is_complete, load_run
from .context import StudioContext

TAB_ID = "history"
MAX_SHOWN = 200


def list_runs(outputs_root: Path) -> list[Path]:
    """Complete run folders under the outputs root, newest first (hidden temp folders skipped)."""
    root = Path(outputs_root)
    if not root.is_dir():
        return []
    folders = [p for p in root.iterdir() if not p.name.startswith(".") and is_complete(p)]
    return sorted(folders, key=lambda p: (p.stat().st_mtime, p.name), reverse=True)[:MAX_SHOWN]


def build(ctx: StudioContext) -> None:
    with gr.Tab("History", id=TAB_ID) as tab:
        with gr.Row():
            refresh = gr.Button("Refresh", size="sm", scale=0)
            count = gr.Markdown()
        gallery = gr.Gallery(label="Run folders (newest first)", columns=4, height="auto", allow_preview=False,
                             elem_id="history-gallery")
        shown = gr.State([])

    def load_history():
        folders = list_runs(ctx.outputs_root)
        items = [(str(p / "poster.jpg"), p.name) for p in folders]
        return items, [str(p) for p in folders], f"{len(folders)} runs in {ctx.outputs_root}"

    def pick(paths: list[str], event: gr.SelectData):
        try:
            run = load_run(Path(paths[event.index]))
        except (IndexError, InputError) as err:
            raise gr.Error(f"that run folder is gone or incomplete ({err}); press Refresh",
                           print_exception=False) from None
        return ctx.results.values_for(run)

    for trigger in (tab.select, refresh.click):
        trigger(load_history, None, [gallery, shown, count], api_visibility="private")
    ctx.defer(lambda: ctx.demo.load(load_history, None, [gallery, shown, count], api_visibility="private"))

    ctx.defer(lambda: gallery.select(pick, shown, ctx.results.components, api_visibility="private").success(
        lambda: gr.Tabs(selected="results"), None, ctx.tabs, queue=False, api_visibility="private"))
