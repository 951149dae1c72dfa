"""What survives a reload: the browser keeps its id, the form's values and the run shown in Results.

The values live in the browser's localStorage (``gr.BrowserState``, keyed by the outputs
root, so a studio restart on the same root reads them back); the server checks each one
when the page loads, as it checks anything a client sends. ``/?run=<run folder name>``
opens that run in Results; a name that is not a complete run folder directly under the
outputs root is refused in the usual words.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import gradio as gr

from ..errors import InputError
from ..run_folder.runs import RunFolder, load_run
from . import form as F
from .context import StudioContext

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
FILE_FIELDS = ("prompt_file", "image")
# Client-side: copy the form into the stored state on every change, without a server round trip.
SAVE_FORM_JS = ("(...values) => { const state = values.pop() || {}; const names = %s;"
                " const form = {}; names.forEach((name, i) => { form[name] = values[i]; });"
                " return {...state, form: form, saved: Date.now() / 1000}; }")


def run_folder_named(outputs_root: Path, name: Any) -> RunFolder:
    """The complete run folder ``name`` directly under the outputs root; refuse anything else (no paths)."""
    if not isinstance(name, str) or not RUN_NAME.fullmatch(name) or ".." in name:
        raise InputError("run", f"{str(name)[:80]!r} is not a run folder name",
                         "use a folder name as History lists it, e.g. /?run=20261203-101500-t2va-272p-s42-ab12cd")
    root = Path(outputs_root).resolve()
    folder = root / name
    if folder.resolve().parent != root:
        raise InputError("run", f"{name!r} is not a run folder under the outputs root",
                         "use a folder name as History lists it")
    try:
        return load_run(folder)
    except InputError:
        raise InputError("run", f"{name!r} is not a complete run folder under {root}",
                         "pick one in History (a cancelled or deleted run leaves no folder)") from None


def storage_key(outputs_root: Path) -> str:
    return "magi2studio-" + hashlib.sha256(str(Path(outputs_root).resolve()).encode()).hexdigest()[:16]


def _stored_value(name: str, value: Any, component: gr.components.Component, uploads: Path) -> Any:
    """A stored field value fit to put back, or ``gr.skip()``: files must still be uploads that exist."""
    if name in FILE_FIELDS:
        path = F.file_path(value) if isinstance(value, (dict, str)) else None
        if not isinstance(path, str):
            return gr.skip()
        resolved = Path(path).resolve()
        if not resolved.is_relative_to(Path(uploads).resolve()) or not resolved.is_file():
            return gr.skip()
        return str(resolved)
    if value is None or isinstance(value, (str, int, float, bool)):
        choices = getattr(component, "choices", None)
        if choices and value not in [choice[1] if isinstance(choice, tuple) else choice for choice in choices]:
            return gr.skip()
        return value
    return gr.skip()


def build(ctx: StudioContext, panel) -> gr.BrowserState:
    """The stored state (call inside a tab); its wiring waits for the form and Results (``ctx.defer``)."""
    key = storage_key(ctx.outputs_root)
    state = gr.BrowserState({}, storage_key=key, secret=key)
    ctx.defer(lambda: _wire(ctx, panel, state))
    return state


def _wire(ctx: StudioContext, panel, state: gr.BrowserState) -> None:
    fields = [ctx.form.fields[name] for name in F.FIELDS]
    save = SAVE_FORM_JS % json.dumps(list(F.FIELDS))
    for component in fields:
        component.change(None, [*fields, state], state, js=save, api_visibility="private")

    def shown(run_path: str | None, stored: dict):
        stored = stored if isinstance(stored, dict) else {}
        if not run_path:
            return gr.skip()
        return {**stored, "run": Path(run_path).name, "shown": time.time()}

    ctx.results.run_path.change(shown, [ctx.results.run_path, state], state, api_visibility="private")

    def restore(stored: Any, request: gr.Request):
        stored = stored if isinstance(stored, dict) else {}
        client = stored.get("client")
        if not isinstance(client, str) or not re.fullmatch(r"[0-9a-f]{32}", client):
            client = uuid.uuid4().hex
        panel.claim(request.session_hash, client)
        form = stored.get("form") if isinstance(stored.get("form"), dict) else {}
        values = {component: _stored_value(name, form[name], component, ctx.uploads)
                  for name, component in zip(F.FIELDS, fields) if name in form}
        run, notice, tab = _run_to_show(ctx, stored, client, request)
        shown_values = ctx.results.values_for(run) if run is not None else {}
        return {**values, **shown_values, state: {**stored, "client": client}, panel.notice: notice,
                ctx.tabs: gr.Tabs(selected="results") if tab else gr.Tabs()}

    ctx.demo.load(restore, state, [*fields, *ctx.results.components, state, panel.notice, ctx.tabs],
                  api_visibility="private", show_progress="hidden")


def _run_to_show(ctx: StudioContext, stored: dict, client: str, request: gr.Request):
    """``?run=`` first; else this browser's newest done job if it finished after Results last showed a run."""
    asked = request.query_params.get("run") if request is not None else None
    if asked is not None:
        try:
            return run_folder_named(ctx.outputs_root, asked), f"opened {asked} (from the address)", True
        except InputError as err:
            return None, f"✗ {err}", False
    shown_at = stored.get("shown") if isinstance(stored.get("shown"), (int, float)) else 0.0
    mine = [job for job in ctx.slot.snapshot().jobs if job.owner == client and job.state == "done" and job.run]
    newer = [job for job in mine if (job.finished or 0.0) > shown_at]
    name = newer[-1].run if newer else stored.get("run")
    if not name:
        return None, "", False
    try:
        return run_folder_named(ctx.outputs_root, name), "", False
    except InputError:
        return None, f"the last run shown here ({str(name)[:80]}) is gone from the outputs root", False
