"""The job list on the Generate tab: every job of the shared queue, with its state, place, time and actions.

The list is the queue file seen through the slot (so jobs added with ``magi2studio queue
add``, or left from before a restart, show too), redrawn every second. Each row's buttons
(cancel, remove, open, run again) send ``{action, job}`` through the HTML component's click
event. Everyone who can open the page sees every job, but acts only on their own: a job's
owner is the browser that queued it (its id, kept in the browser's storage, see
``session_state``) or, for an API client, its Gradio session (:func:`session_owner`). A job
id alone, which the list shows, moves nothing. A finished run shows its poster; a batch's
runs show their batch and what sets each apart. Pause, resume and edit are
:mod:`.queue_steering`'s.
"""

from __future__ import annotations

import html
import os
import time
from dataclasses import dataclass, field
from urllib.parse import quote

import gradio as gr

from ..errors import InputError
from ..jobs.eta import Estimate
from ..jobs.jobqueue import JobRecord
from ..jobs.runner import OtherWeights, check_weights, engine_weights, plan_record
from . import queue_steering
from .context import StudioContext
from .form import FIELDS as FORM_FIELDS
from .served import cached
from .session_state import run_folder_named

MAX_FINISHED_SHOWN = 20
CLICKS = ("element.addEventListener('click', (event) => {"
          " const button = event.target.closest('button[data-action]');"
          " if (button) trigger('click', {action: button.dataset.action, job: button.dataset.job}); });")
ACTIONS = {"waiting": ("up", "down", "edit", "cancel"), "running": ("cancel",), "done": ("open", "remove"),
           "cancelled": ("run again", "remove"), "failed": ("run again", "remove"),
           "refused": ("remove",), "interrupted": ("run again", "remove")}


def session_owner(request: gr.Request | None) -> str:
    """The owner name of a Gradio session. Prefixed: a session hash is the client's to pick, and must never equal
    a browser id (32 hex digits) or ``cli`` (jobs of ``magi2studio queue add``)."""
    return f"session-{getattr(request, 'session_hash', None) or 'none'}"


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value < 120 else f"{value / 60:.1f} min"


@dataclass
class JobPanel:
    """The job list's component, and which browser (kept across reloads) each page session is."""

    ctx: StudioContext
    table: gr.HTML = None
    notice: gr.Markdown = None
    _owners: dict[str, str] = field(default_factory=dict)
    _estimates: dict[str, Estimate | None] = field(default_factory=dict)
    _posters: dict[str, str | None] = field(default_factory=dict)  # run folder name -> its poster's cached copy
    steering: queue_steering.Steering | None = None

    def claim(self, session_hash: str | None, client: str) -> None:
        """Link a page session to its browser's id (from the browser's storage), so jobs outlive a reload."""
        if session_hash:
            self._owners[session_hash] = client

    def owner(self, request: gr.Request | None) -> str:
        """The browser id of the page that sent ``request``, else its Gradio session (API clients)."""
        return self._owners.get(getattr(request, "session_hash", None) or "", "") or session_owner(request)

    def owns(self, record: JobRecord, request: gr.Request | None) -> bool:
        """Whether the caller queued the job: from its browser, or from this very session (Reproduce, API)."""
        return record.owner in (self.owner(request), session_owner(request))

    def source(self, request: gr.Request | None) -> str:
        """studio for a page (it registered its browser id on load), api for any other client."""
        return "studio" if getattr(request, "session_hash", None) in self._owners else "api"

    def _estimate(self, record: JobRecord) -> Estimate | None:
        if record.id not in self._estimates:
            try:
                plan = plan_record(self.ctx.engine, record)
            except InputError:
                plan = None
            self._estimates[record.id] = plan and self.ctx.slot.history.estimate(
                self.ctx.engine.name, plan, engine_starts=self.ctx.engine.layout != plan.layout)
        return self._estimates[record.id]

    def forget_estimate(self, job_id: str) -> None:
        """An edited job's estimate is planned again."""
        self._estimates.pop(job_id, None)

    def _poster(self, run: str | None) -> str | None:
        """The finished run's poster as a served URL: a copy in Gradio's cache, made again only once the cache
        sweeper has removed it (``served.CacheSweeper``)."""
        if not run:
            return None
        copy = self._posters.get(run)
        if copy is None or not os.path.exists(copy):
            copy = self._posters[run] = cached(self.ctx.outputs_root / run / "poster.jpg", self.ctx.outputs_root)
        return f"gradio_api/file={quote(copy)}" if copy else None

    def rows(self, now: float | None = None, request: gr.Request | None = None) -> list[dict[str, str]]:
        """One dict per shown job: running first, then waiting in order, then the newest finished."""
        now = time.time() if now is None else now
        state = self.ctx.slot.snapshot()
        running = self.ctx.slot.running_clock()
        finished = [job for job in state.jobs if not job.pending][::-1][:MAX_FINISHED_SHOWN]
        ordered = [job for job in state.jobs if job.state == "running"] + state.waiting() + finished
        start_in = 0.0  # seconds until the next waiting job starts, while every step of it is known
        rows = []
        for job in ordered:
            if job.state == "running":
                clock = running[1] if running is not None and running[0] == job.id else None
                left = clock.remaining_s() if clock is not None else None
                start_in = left if left is not None else None
                when = f"{_seconds(now - (job.started or now))} so far"
                detail = clock.line() if clock is not None else "starting"
            elif job.state == "waiting":
                position = state.position(job.id)
                estimate = self._estimate(job)
                when = f"starts in ~{_seconds(start_in)}" if start_in is not None else "waits"
                start_in = start_in + estimate.total_s if start_in is not None and estimate else None
                detail = f"position {position}" + (f" · takes ~{_seconds(estimate.total_s)}" if estimate else "")
            else:
                took = (job.finished - job.started) if job.finished and job.started else None
                when = f"took {_seconds(took)}" if took is not None and job.state == "done" else time.strftime(
                    "%H:%M:%S", time.localtime(job.finished or job.submitted))
                detail = job.message
            if job.pending and (other := self._other_weights(job)):
                detail = f"{detail} · {other}"
            batch = f" · batch {job.batch[:6]}: {job.label}" if job.batch else ""
            rows.append({"id": job.id, "ticket": str(job.ticket), "state": job.state, "what": job.summary() + batch,
                         "source": job.source, "when": when, "detail": detail,
                         "poster": self._poster(job.run) if job.state == "done" else None,
                         "actions": self._actions(job) if self.owns(job, request) else ()})
        return rows

    def _other_weights(self, job: JobRecord) -> str | None:
        """Said on a job queued for other embedded weights than the studio's, before it fails on them
        (``runner.check_weights``): which it was queued for and which the studio runs."""
        try:
            check_weights(self.ctx.engine, job)
        except OtherWeights:
            return (f"queued for the weights {job.weights}, this studio runs "
                    f"{engine_weights(self.ctx.engine)[0]}: it will fail")
        return None

    def _actions(self, job: JobRecord) -> tuple[str, ...]:
        """The row's buttons; no "open" once its run folder was deleted (History's delete)."""
        actions = ACTIONS[job.state]
        if "open" in actions and (job.run is None or not (self.ctx.outputs_root / job.run).is_dir()):
            actions = tuple(action for action in actions if action != "open")
        return actions

    def render(self, request: gr.Request | None = None) -> str:
        """The list as the caller sees it: buttons only on the caller's own jobs."""
        rows = self.rows(request=request)
        paused = ('<p class="m2s-queue-paused" id="queue-paused">⏸ Queue paused: no waiting job starts until it is '
                  'resumed (the running one finishes).</p>' if self.ctx.slot.snapshot().paused else "")
        if not rows:
            return paused + ('<p class="m2s-jobs-empty">No jobs yet: Generate adds one (you can add more while one '
                             'runs).</p>')
        body = "".join(
            f'<tr data-job="{row["id"]}" data-state="{row["state"]}"><td>#{row["ticket"]}</td>'
            f'<td class="m2s-job-state">{row["state"]}</td><td>'
            + (f'<img class="m2s-job-poster" src="{html.escape(row["poster"])}" alt="poster of #{row["ticket"]}" '
               'width="64" style="float:left;margin-right:6px">' if row["poster"] else "")
            + f'{html.escape(row["what"])}'
            f'<br><small>from {html.escape(row["source"])} · id {row["id"][:8]}</small></td>'
            f'<td>{html.escape(row["when"])}</td><td>{html.escape(row["detail"])}</td><td>'
            + "".join(f'<button data-action="{action}" data-job="{row["id"]}" aria-label="{action} job '
                      f'#{row["ticket"]}: {html.escape(row["what"], quote=True)}">{action}</button>'
                      for action in row["actions"])
            + "</td></tr>" for row in rows)
        return paused + ('<table class="m2s-jobs"><thead><tr><th>#</th><th>state</th><th>job</th><th>time</th>'
                f'<th>progress</th><th></th></tr></thead><tbody>{body}</tbody></table>')

    def edit(self, job_id: str, request: gr.Request | None) -> dict:
        """The "edit" button: the caller's waiting job loaded into the Generate form, with the edit bar shown."""
        try:
            record = self.ctx.slot.snapshot().find(job_id)
            if not self.owns(record, request):
                raise InputError("job", f"#{record.ticket} was queued by another browser or client",
                                 "edit your own jobs (the rows with buttons)")
            if record.state != "waiting":
                raise InputError("job", f"#{record.ticket} is {record.state}, not waiting",
                                 "only a waiting job can be edited")
        except InputError as err:
            return {self.table: self.render(request), self.notice: f"✗ {err}"}
        return {self.table: self.render(request), self.notice: f"#{record.ticket} is in the form: edit, then save",
                **self.steering.start_edit(self.ctx, record)}

    def act(self, action: str, job_id: str, request: gr.Request | None) -> tuple[str, object]:
        """Do one row button's action; returns the notice line and the run folder to open (or None)."""
        slot = self.ctx.slot
        try:
            record = slot.snapshot().find(job_id)
            if not self.owns(record, request):
                raise InputError("job", f"#{record.ticket} was queued by another browser or client",
                                 "act on your own jobs (the rows with buttons)")
            if action == "cancel":
                if not slot.cancel_job(record.id):
                    raise InputError("job", f"#{record.ticket} is {record.state}",
                                     "only waiting or running jobs can be cancelled")
                return f"#{record.ticket}: cancelling (a running job stops at its next step or stage boundary)", None
            if action in ("up", "down"):
                position = slot.steer("move", record.id, -1 if action == "up" else 1)
                return f"#{record.ticket} moved {action}: position {position}", None
            if action == "remove":
                slot.remove_job(record.id)
                return f"#{record.ticket} removed from the list (its run folder, if any, stays)", None
            if action == "open":
                if record.run is None:
                    raise InputError("job", f"#{record.ticket} has no run folder", "open a job that is done")
                run = run_folder_named(self.ctx.outputs_root, record.run)
                return f"#{record.ticket}: showing {record.run} in Results", run
            if action == "run again":
                job = slot.submit(plan_record(self.ctx.engine, record), self.owner(request))
                return f"#{record.ticket} queued again as #{job.ticket}", None
        except InputError as err:
            return f"✗ {err}", None
        return f"✗ action: {action!r} is not a job action. Fix: use the row's buttons", None


def build(ctx: StudioContext) -> JobPanel:
    """The job list (inside the Generate tab), redrawn every second; its actions are wired once Results exists."""
    panel = JobPanel(ctx)
    with gr.Group(elem_id="job-panel-group"):
        gr.Markdown("**Jobs** · the shared queue: every page, API client and `magi2studio queue add` adds here",
                    elem_id="job-panel-title")
        panel.table = gr.HTML(panel.render(), elem_id="job-panel", js_on_load=CLICKS)
        panel.notice = gr.Markdown(elem_id="job-notice")
        panel.steering = queue_steering.build(ctx, panel)
    timer = gr.Timer(1.0)

    def redraw(request: gr.Request) -> str:
        return panel.render(request)

    timer.tick(redraw, None, panel.table, queue=False, show_progress="hidden", api_visibility="private")

    def clicked(event: gr.EventData, request: gr.Request):
        data = getattr(event, "_data", None) or {}
        if data.get("action") == "edit":
            return panel.edit(str(data.get("job", "")), request)
        notice, run = panel.act(str(data.get("action", "")), str(data.get("job", "")), request)
        shown = ctx.results.values_for(run) if run is not None else {}
        if run is not None:
            ctx.results.opened(request)
        return {panel.table: panel.render(request), panel.notice: notice, **shown,
                ctx.tabs: gr.Tabs(selected="results") if run is not None else gr.Tabs()}

    ctx.defer(lambda: panel.table.click(
        clicked, None, [panel.table, panel.notice, *ctx.results.components, ctx.tabs,
                        *[ctx.form.fields[name] for name in FORM_FIELDS], *panel.steering.edit_outputs],
        api_visibility="private", show_progress="hidden"))
    return panel
