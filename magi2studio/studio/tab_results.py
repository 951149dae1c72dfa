"""Results: the mp4 (with its audio track), the WAV, the per-step timing plot, the summary
table, the manifest and a zip of the run folder, next to each other; "Use these settings"
fills the Generate form back in from the manifest (History's runs too: they open here), and
warns under the Generate button when the run's embedded weights are not the studio's."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr

from ..engines.embedded.tiny_weights import TRAINED_SHA256
from ..errors import InputError
from ..jobs.runner import engine_weights
from ..reproduction.references import weights_identity
from ..run_folder.runs import RunFolder, load_run, manifest_request
from . import batch_panel
from . import results as R
from .context import StudioContext
from .form import FIELDS
from .served import cached
from .timing_plot import timing_html

TAB_ID = "results"


@dataclass
class ResultsView:
    """The result components, and the values they take for one run folder."""

    headline: gr.Markdown
    video: gr.Video
    wav: gr.Audio
    plot: gr.HTML
    summary: gr.Dataframe
    manifest: gr.JSON
    download: gr.File
    run_path: gr.State
    studio: StudioContext
    _opened: dict[str, float] = field(default_factory=dict)  # page session -> when its person last opened a run

    def opened(self, request: gr.Request | None) -> None:
        """The person on this page opened a run (job list, History, a batch's grid): the page's own jobs that
        finish later leave Results to it (:meth:`opened_since`)."""
        session = getattr(request, "session_hash", None)
        if session:
            self._opened[session] = time.time()

    def opened_since(self, request: gr.Request | None, since: float) -> bool:
        """Whether the person on this page opened a run after ``since`` (a job's submission)."""
        return self._opened.get(getattr(request, "session_hash", None) or "", float("-inf")) >= since

    @property
    def components(self) -> list[Any]:
        """In the order of the generate endpoint's first outputs."""
        return [self.video, self.wav, self.manifest, self.download, self.plot, self.summary, self.headline,
                self.run_path]

    def _zip(self, run: RunFolder) -> Path:
        path = R.zip_run(run, self.studio.scratch)
        self.studio.trim_scratch(keep=path)
        return path

    def values_for(self, run: RunFolder) -> dict[Any, Any]:
        return {
            self.headline: R.headline(run),
            self.video: cached(run.video, self.studio.outputs_root),
            self.wav: cached(run.wav, self.studio.outputs_root),
            self.manifest: run.manifest,
            self.download: str(self._zip(run)),
            self.plot: timing_html(R.load_timing(run)),
            self.summary: R.summary_frame(run.manifest),
            self.run_path: str(run.path),
        }


def build(ctx: StudioContext) -> None:
    with gr.Tab("Results", id=TAB_ID):
        headline = gr.Markdown("No run yet: generate one, or pick one in History.", elem_id="run-headline",
                               label="headline")
        with gr.Row(equal_height=False):
            with gr.Column():
                video = gr.Video(label="video.mp4 (with its audio track)", elem_id="result-video",
                                 interactive=False, autoplay=False, loop=False)
                wav = gr.Audio(label="audio.wav", type="filepath", interactive=False, elem_id="result-wav")
            with gr.Column():
                gr.Markdown("**Per-step time**: the slowest rank per step (the gate metric drops steps 0-1), "
                            "and each rank; one panel per stage. Hover a point for its time.")
                plot = gr.HTML(timing_html(R.timing_frame([])), elem_id="timing-plot")
                summary = gr.Dataframe(value=R.summary_frame({}), headers=["what", "value"], interactive=False,
                                       label="Timing summary", elem_id="timing-summary", wrap=True,
                                       column_widths=["55%", "45%"])
        with gr.Row():
            reuse = gr.Button("Use these settings", elem_id="use-settings")
            download = gr.File(label="The run folder as a zip", interactive=False, elem_id="run-zip")
        with gr.Accordion("manifest.json", open=False):
            manifest = gr.JSON(label="manifest", elem_id="manifest")
        run_path = gr.State(None)
        batch_panel.build_grid(ctx, run_path, "results-batch")

    ctx.results = ResultsView(headline, video, wav, plot, summary, manifest, download, run_path, ctx)

    def use_settings(path: str | None):
        return settings_of_run(ctx, path)

    ctx.defer(lambda: reuse.click(use_settings, run_path,
                                  [*[ctx.form.fields[n] for n in FIELDS], ctx.form.errors["general"]],
                                  api_visibility="private").success(
        lambda: gr.Tabs(selected="generate"), None, ctx.tabs, queue=False, api_visibility="private"))


def settings_of_run(ctx: StudioContext, path: str | None) -> list[Any]:
    """"Use these settings": the Generate form's values (in :data:`form.FIELDS` order) from the run's manifest,
    then the update of the line under the Generate button: :func:`weights_warning`, or cleared."""
    if not path:
        raise gr.Error("no run is shown: generate one, or pick one in History", print_exception=False)
    try:
        manifest = load_run(Path(path)).manifest
        manifest_request(manifest)  # every field the form is refilled with, checked by the request's rules
    except InputError as err:
        raise gr.Error(str(err), print_exception=False) from None
    warning = weights_warning(manifest, ctx.engine, Path(path))
    return [*ctx.form.values_from_manifest(manifest), gr.update(value=warning, visible=bool(warning))]


def weights_warning(manifest: dict[str, Any], engine: Any, run_path: Path) -> str:
    """Why a run of these settings here will not repeat the run: its weights (the checkpoint's tree sha256, else
    ``random``) are not the ones the studio's engine runs; "" when they are (or neither is the embedded engine:
    the real model runs the mounted checkpoint, which no manifest names by digest)."""
    ran = weights_identity(manifest.get("engine", {}))
    name, digest = engine_weights(engine)
    runs = digest or name
    if ran == runs:
        return ""
    return (f"⚠ **Other weights**: {run_path.name} ran on {_ran_on(manifest.get('engine', {}))}; this studio runs "
            f"{_runs_on(engine, name, digest)}. The form holds the run's settings, but a run of them here will differ "
            f"from it. To reproduce it exactly (on its own weights): `magi2studio replay {run_path}`")


def _ran_on(block: dict[str, Any]) -> str:
    if not block.get("embedded"):
        return f"the {block.get('name', 'unknown')} engine's checkpoint"
    digest = block.get("weights_sha256")
    if not digest:
        return "the embedded weights random"
    if digest == TRAINED_SHA256:
        return "the embedded weights trained"
    return f"the embedded weights of the folder {block.get('weights')} (tree sha256 {digest[:12]})"


def _runs_on(engine: Any, name: str | None, digest: str | None) -> str:
    if name is None:
        return f"the {getattr(engine, 'name', 'unknown')} engine's checkpoint"
    if name in ("random", "trained"):
        return name
    return f"the folder {name} (tree sha256 {(digest or '')[:12]})"
