"""The studio's health endpoints, apart as vLLM, NIM and Triton keep them.

``/health/live``: the process answers (an orchestrator restarts it when this fails).
``/health/ready``: the engine can take a job of some tier: the slot is open, its worker runs, and the engine's own
check of that tier (``Engine.tiers_not_ready``: its weights checked, engine startable) passes; 503 with the reason
when no tier can run. The body names each tier's verdict: a tree without the refiner is ready for 272p and 540p and
says why 1080p is not.
The image's HEALTHCHECK and compose probe readiness. No login guards them: a probe has none.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ..vocabulary.tiers import TIERS
from .context import StudioContext

LIVE = "/health/live"
READY = "/health/ready"


def tiers_not_ready(ctx: StudioContext) -> dict[str, str | None]:
    """Per tier, why a job of it cannot run now, or None: the slot first (it runs every tier), then the engine."""
    if ctx.slot.closed:
        return dict.fromkeys(TIERS, "the studio is shutting down")
    if not ctx.slot.serving:
        return dict.fromkeys(TIERS, "the engine slot's worker stopped (its error is in the studio's log): no job "
                                    "runs; restart the studio")
    return ctx.engine.tiers_not_ready()


def not_ready(ctx: StudioContext) -> str | None:
    """Why no tier can take a job, or None while one can: the least demanding tier's reason (it needs the least)."""
    reasons = tiers_not_ready(ctx)
    return None if None in reasons.values() else next(iter(reasons.values()))


def readiness(ctx: StudioContext) -> dict:
    """/health/ready's body: ready while some tier can take a job, and each tier's verdict with its reason."""
    try:
        reasons = tiers_not_ready(ctx)
    except OSError as err:  # a file the weights check may not read: not ready, and why, not a 500
        reasons = dict.fromkeys(TIERS, f"readiness could not be checked ({err.__class__.__name__}: "
                                       f"{' '.join(str(err).split())})")
    ready = None in reasons.values()
    return {"ready": ready, "reason": None if ready else next(iter(reasons.values())),
            "tiers": {name: {"ready": reason is None, "reason": reason} for name, reason in reasons.items()}}


def routes(ctx: StudioContext) -> list[Route]:
    """Starlette routes for ``demo.launch(app_kwargs={"routes": ...})``: ahead of Gradio's own."""

    async def live(_: Request) -> JSONResponse:
        return JSONResponse({"live": True})

    def ready(_: Request) -> JSONResponse:  # sync: Starlette runs it in a thread (the weights check reads files)
        body = readiness(ctx)
        return JSONResponse(body, status_code=200 if body["ready"] else 503)

    return [Route(LIVE, live, methods=["GET", "HEAD"]), Route(READY, ready, methods=["GET", "HEAD"])]
