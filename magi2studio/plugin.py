"""vLLM worker plugin: per-step timing on every rank and the project's kernels, by env.

Declared in the ``vllm.general_plugins`` entry-point group; vLLM-Omni calls
``load_omni_general_plugins()`` in every diffusion worker, so :func:`register` runs once per
worker process before the pipeline is built. It replaces the MUSA report's ``instrument-steps.py``
(which edited installed sources): nothing on disk is changed.

Env switches (read in the worker, so set them before the engine starts):

- ``MAGI2STUDIO_METRICS_DIR``: folder for this engine's records (:mod:`.metrics_folder`). Each rank appends its step
  records to ``steps-rank<N>.jsonl``; rank 0 also appends ``progress.jsonl`` (one line per
  finished step). Unset: hooks stay installed but nothing is timed.
- ``MAGI2STUDIO_CANCEL_FILE``: when this file exists at a step end, the step raises
  :class:`~magi2studio.errors.Cancelled` (a step-boundary stop; host-side ``os.path.exists``), on every rank
  at the same step once any rank saw it (:func:`seen_by_any_rank`).
- ``MAGI2STUDIO_PREVIEW_MAP`` / ``MAGI2STUDIO_PREVIEW_EVERY``: rank 0 writes the live preview
  (:mod:`.engines.live_preview`) every N steps (default 10) into ``<metrics>/preview/``; the map is a
  file ``scripts/fit_preview_map.py`` wrote for this decoder. Unset: no preview. The rate an engine
  wrote into ``<metrics>/preview-request.json`` for the request (read at each sample's start) wins over
  ``MAGI2STUDIO_PREVIEW_EVERY``.
- ``MAGI2STUDIO_STAGE``: the stage name in the records (default ``preview``).
- ``MAGI2_KERNELS``: ``off`` (default), ``on``, or per kernel; handed to
  ``magi2_kernels.overrides``. What was installed is written to ``kernels.json``.
- ``MAGI2STUDIO_TEST_CHECKPOINT``: test-only; the root of a tree ``scripts/make-test-checkpoint``
  wrote. Its reduced depth replaces upstream's (:mod:`magi2studio.engines.test_checkpoint`, refused for an
  unmarked tree) and is written to ``test-checkpoint.json``. Unset by default.

Always: MAGI-2's pipeline is opted into upstream's cooperative cancellation, checked at every step
end (:func:`install_request_cancellation`), so an aborted request stops at the next step boundary.

Idempotent: a second call returns the first call's state. Loud: a hooked or patched name
missing from the installed vLLM-Omni raises at start-up instead of timing nothing.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import Cancelled
from .engines.metrics_folder import (
    ENV_CANCEL_FILE,
    ENV_METRICS_DIR,
    ENV_PREVIEW_EVERY,
    ENV_PREVIEW_MAP,
    PROGRESS_FILE,
    kernels_file,
    preview_folder,
    read_preview_request,
    steps_file,
    test_checkpoint_file,
)
from .engines.live_preview import LinearPreviewMap, LivePreview
from .engines.test_checkpoint import apply_from_env as apply_test_checkpoint_depth
from .engines.timing import (
    StepRecord,
    StepTimer,
    install_step_hooks,
    set_process_timer,
    set_step_boundary_check,
    write_jsonl,
)
from .platform import current_platform

ENV_STAGE = "MAGI2STUDIO_STAGE"
ENV_KERNELS = "MAGI2_KERNELS"

_state: dict[str, Any] | None = None


def current_rank() -> int:
    """This worker's global rank: torch.distributed once initialized, else the launcher's env."""

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


class WorkerStepTimer(StepTimer):
    """The run folder's timing.StepTimer, with the rank read per sample (workers learn it after plugins load)."""

    def __init__(self, metrics_dir: Path, stage: str, cancel_file: str | None) -> None:
        super().__init__(stage=stage, on_step=self._step_finished, on_sample=self._sample_finished)
        self.metrics_dir = metrics_dir
        self.cancel_file = cancel_file

    def begin_sample(self, latent: Any, total_steps: int) -> None:
        self.rank = current_rank()
        self.preview = live_preview_from_env(self.metrics_dir) if self.rank == 0 else None
        super().begin_sample(latent, total_steps)

    def _step_finished(self, stage: str, index: int, total: int) -> None:
        if self.rank == 0:
            with open(self.metrics_dir / PROGRESS_FILE, "a", encoding="utf-8") as file:
                file.write(json.dumps({"stage": stage, "step": index, "total": total}) + "\n")
        if self.cancel_file and seen_by_any_rank(os.path.exists(self.cancel_file)):
            raise Cancelled(f"cancelled after {stage} step {index + 1} of {total}")

    def _sample_finished(self, records: list[StepRecord]) -> None:
        write_jsonl(records, steps_file(self.metrics_dir, self.rank))


def seen_by_any_rank(seen: bool) -> bool:
    """Whether any rank of this worker's world saw ``seen``: every rank gets the same answer at the same step.

    Each rank looks for the cancel file on its own, a moment apart; one that saw it stopped while another went
    on into the next step's collectives, and both waited until the studio's step watchdog ended the engine.
    One gloo all-reduce on the world group's CPU side (where upstream's own cancellation check votes).
    """

    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return seen
    from vllm_omni.diffusion.distributed import parallel_state

    group = parallel_state.get_world_group().cpu_group if parallel_state._WORLD is not None else None
    if dist.get_world_size(group) <= 1:
        return seen
    flag = torch.tensor([int(seen)], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return bool(flag.item())


def live_preview_from_env(metrics_dir: Path, environ: Mapping[str, str] = os.environ) -> LivePreview | None:
    """This sample's live preview into ``<metrics>/preview/`` when ``MAGI2STUDIO_PREVIEW_MAP`` names a fitted map.

    Made at each sample's start (host side, before the loop), so the request's rate in the metrics folder
    (:func:`~.engines.metrics_folder.read_preview_request`) applies without restarting the workers.
    No map is committed for the real Wan2.2 latent (none can be fitted without its VAE here): unset, off.
    """

    map_file = environ.get(ENV_PREVIEW_MAP)
    every = read_preview_request(metrics_dir)
    if every is None:
        every = int(environ.get(ENV_PREVIEW_EVERY, "10") or 0)
    if not map_file or every <= 0:
        return None
    return LivePreview(preview_folder(metrics_dir), every, read_map(map_file))


@functools.lru_cache(maxsize=2)
def read_map(map_file: str) -> LinearPreviewMap:
    """The map file, read once per worker (each sample's preview reuses it)."""

    return LinearPreviewMap.read(map_file)


def install_kernel_overrides(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """Install the project's kernels as ``MAGI2_KERNELS`` asks (``magi2_kernels.overrides``).

    Gated inside ``install_overrides`` on the kernels' platform (``current_platform.kernels``), never
    on a tensor's device; a patched name missing upstream raises ``UpstreamMismatch`` before anything is patched.
    """

    selection = environ.get(ENV_KERNELS, "off").strip()
    if selection.lower() in ("", "off"):
        return {"selection": "off", "installed": {}}
    from magi2_kernels.overrides import install_overrides

    return {"selection": selection, "installed": install_overrides(selection, current_platform.kernels)}


def install_request_cancellation() -> str:
    """Opt MAGI-2's pipeline into upstream's cooperative cancellation and check it at every step end.

    vLLM-Omni 0.30.0 turns an abort (``DELETE /v1/videos/{id}``'s ``abort_request``, ``Omni.abort``) into a
    shared-memory flag that only a pipeline declaring ``supports_request_cancellation`` gets, read where that
    pipeline calls ``check_request_cancellation``. MAGI-2's pipeline declares neither, so on the H100
    (2026-12-06) a job deleted after step 1 of 40 went on denoising (16 more steps in the 8 s watched) and
    upstream logged it aborted only 20 s later, when all 40 had run. The engine reads the class attribute
    when it is built, so this runs in the engine's process as in the workers (both load the plugins first).
    The check is a no-op without a signal; with several ranks it is one gloo all-reduce per step, so that
    every rank stops at the same step.
    """

    from vllm_omni.diffusion.cancellation import check_request_cancellation
    from vllm_omni.diffusion.models.magi2.pipeline_magi2 import Magi2Pipeline

    Magi2Pipeline.supports_request_cancellation = True
    set_step_boundary_check(check_request_cancellation)
    return "vllm_omni.diffusion.cancellation.check_request_cancellation at every step end"


def register() -> dict[str, Any]:
    """The entry point: install the step hooks and kernel overrides once per process."""

    global _state
    if _state is not None:
        return _state
    test_depth = apply_test_checkpoint_depth()
    sampler_cls = install_step_hooks()
    kernels = install_kernel_overrides()
    cancellation = install_request_cancellation()
    metrics_dir = os.environ.get(ENV_METRICS_DIR)
    timer = None
    if metrics_dir:
        folder = Path(metrics_dir)
        folder.mkdir(parents=True, exist_ok=True)
        timer = WorkerStepTimer(folder, os.environ.get(ENV_STAGE, "preview"), os.environ.get(ENV_CANCEL_FILE))
        set_process_timer(timer)
        kernels_file(folder).write_text(json.dumps(kernels, sort_keys=True, default=str), encoding="utf-8")
        if test_depth is not None:
            test_checkpoint_file(folder).write_text(json.dumps(test_depth, sort_keys=True), encoding="utf-8")
    _state = {"sampler": f"{sampler_cls.__module__}.{sampler_cls.__qualname__}", "kernels": kernels,
              "metrics_dir": metrics_dir, "timer": timer, "test_checkpoint": test_depth,
              "request_cancellation": cancellation}
    return _state
