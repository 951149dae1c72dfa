"""History: past run folders as a searchable gallery, newest first; picking one shows what it is, opens it
in Results, or deletes it after a confirmation."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from ..errors import InputError
from ..run_folder.runs import load_run
from . import batch_panel
from . import history as H
from .context import StudioContext
from .served import cached

TAB_ID = "history"


def build(ctx: StudioContext) -> None:
    with gr.Tab("History", id=TAB_ID) as tab:
        with gr.Row(equal_height=True):
            query = gr.Textbox(label="Search", placeholder="words of the prompt, a seed, 272p, sp2-cfg1, 2026-12-04 …",
                               elem_id="history-search", scale=4)
            refresh = gr.Button("Refresh", size="sm", scale=0, min_width=100)
        count = gr.Markdown(elem_id="history-count")
        gallery = gr.Gallery(label="Run folders (newest first)", columns=5, height="auto", allow_preview=False,
                             object_fit="cover", elem_id="history-gallery", show_label=False)
        with gr.Column(visible=False, elem_id="history-picked") as picked_panel:
            picked_text = gr.Markdown(elem_id="history-details")
            with gr.Row():
                open_run = gr.Button("Open in Results", variant="primary", elem_id="history-open", scale=0,
                                     min_width=180)
                ask_delete = gr.Button("Delete this run…", variant="stop", elem_id="history-delete", scale=0,
                                       min_width=180)
            with gr.Row(visible=False, elem_id="history-confirm") as confirm_row:
                confirm_text = gr.Markdown()
                confirm = gr.Button("Yes, delete it", variant="stop", elem_id="history-delete-yes", scale=0)
                keep = gr.Button("Keep it", elem_id="history-delete-no", scale=0)
        with gr.Row(visible=False, elem_id="history-undo-row") as undo_row:
            undo_text = gr.Markdown()
            undo = gr.Button("Undo", elem_id="history-undo", scale=0, min_width=100)
        deleted = gr.State(None)
        picked = gr.State(None)
        batch_panel.build_grid(ctx, picked, "history-batch")
        shown = gr.State([])

    def load_history(text: str | None):
        entries = H.list_entries(ctx.outputs_root)
        found = H.search(entries, text)
        runs = f"{len(entries)} run{'' if len(entries) == 1 else 's'}"
        what = f"{len(found)} of {runs}" if (text or "").strip() else runs
        found = [(e, poster) for e in found if (poster := cached(e.path / "poster.jpg", ctx.outputs_root))]
        return ([(poster, e.caption()) for e, poster in found], [str(e.path) for e, _ in found],
                f"{what} in {ctx.outputs_root}", gr.Column(visible=False), None)

    listing = [gallery, shown, count, picked_panel, picked]

    def pick(paths: list[str], event: gr.SelectData):
        try:
            path = Path(paths[event.index])
            entry = next(e for e in H.list_entries(ctx.outputs_root) if e.path == path)
        except (IndexError, StopIteration):
            raise gr.Error("run: that run folder is gone or incomplete. Fix: press Refresh",
                           print_exception=False) from None
        return gr.Column(visible=True), H.details(entry), str(path), gr.Row(visible=False)

    def open_in_results(path: str | None, request: gr.Request):
        try:
            run = load_run(Path(path or ""))
        except InputError as err:
            raise gr.Error(f"{err} (press Refresh)", print_exception=False) from None
        ctx.results.opened(request)
        return ctx.results.values_for(run)

    def delete(path: str | None, text: str | None):
        try:
            name = H.delete_run(ctx.outputs_root, path or "")
        except InputError as err:
            raise gr.Error(str(err), print_exception=False) from None
        return (*load_history(text), gr.Row(visible=False), gr.Row(visible=True),
                f"Deleted **{name}**. Undo puts it back (until the next delete or the studio's exit).", name)

    def undo_delete(name: str | None, text: str | None):
        try:
            H.undo_delete(ctx.outputs_root, name or "")
        except InputError as err:
            raise gr.Error(str(err), print_exception=False) from None
        return (*load_history(text), gr.Row(visible=False), None)

    for trigger in (tab.select, refresh.click, query.change):
        trigger(load_history, query, listing, api_visibility="private")
    ctx.defer(lambda: ctx.demo.load(load_history, query, listing, api_visibility="private"))
    gallery.select(pick, shown, [picked_panel, picked_text, picked, confirm_row], api_visibility="private")
    ask_delete.click(lambda path: (gr.Row(visible=True), f"Delete **{Path(path).name}** and all its files for good?"
                                   if path else ""), picked, [confirm_row, confirm_text], api_visibility="private")
    keep.click(lambda: gr.Row(visible=False), None, confirm_row, api_visibility="private")
    confirm.click(delete, [picked, query], [*listing, confirm_row, undo_row, undo_text, deleted],
                  api_visibility="private")
    undo.click(undo_delete, [deleted, query], [*listing, undo_row, deleted], api_visibility="private")
    ctx.defer(lambda: open_run.click(open_in_results, picked, ctx.results.components, api_visibility="private")
              .success(lambda: gr.Tabs(selected="results"), None, ctx.tabs, queue=False, api_visibility="private"))
