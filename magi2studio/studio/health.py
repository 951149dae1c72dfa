"""The studio's health endpoints, apart as vLLM, NIM and Triton keep them.

``/health/live``: the process answers (an orchestrator restarts it when this fails).
``/health/ready``: the engine can take a job: the slot is open, its worker runs, and the engine's own check
(``Engine.not_ready``: weights checked, engine startable) passes; 503 with the reason when not.
The image's HEALTHCHECK and compose probe readiness. No login guards them: a probe has none.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .context import StudioContext

LIVE = "/health/live"
READY = "/health/ready"


def not_ready(ctx: StudioContext) -> str | None:
    if ctx.slot.closed:
        return "the studio is shutting down"
    if not ctx.slot.serving:
        return "the engine slot's worker stopped (its error is in the studio's log): no job runs; restart the studio"
    return ctx.engine.not_ready()


def routes(ctx: StudioContext) -> list[Route]:
    """Starlette routes for ``demo.launch(app_kwargs={"routes": ...})``: ahead of Gradio's own."""

    async def live(_: Request) -> JSONResponse:
        return JSONResponse({"live": True})

    def ready(_: Request) -> JSONResponse:  # sync: Starlette runs it in a thread (the weights check reads files)
        try:
            reason = not_ready(ctx)
        except OSError as err:  # a file the weights check may not read: not ready, and why, not a 500
            reason = f"readiness could not be checked ({err.__class__.__name__}: {' '.join(str(err).split())})"
        return JSONResponse({"ready": reason is None, "reason": reason}, status_code=200 if reason is None else 503)

    return [Route(LIVE, live, methods=["GET", "HEAD"]), Route(READY, ready, methods=["GET", "HEAD"])]
