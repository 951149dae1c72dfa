"""What upstream's MAGI-2 pipeline accepts as a parallel topology, asked in one place.

vLLM-Omni 0.30.0 states its rules in ``pipeline_magi2._validate_native_topology``: query and KV
heads divide TP x SP, ``cfg_parallel_size`` is 1 or 2, VAE patch-parallel is 1 or the world
size, four or eight workers (or one with layerwise offload), no ``enable_expert_parallel``.
The released checkpoint's head counts are its ``MAGI2_PREVIEW_CONFIG``. :func:`refusal` runs
that validator on real ``OmniDiffusionConfig`` objects; :func:`upstream_rules` probes it once
for the numbers the layout rules (``layouts.rules_for_real_model``) and the vLLM-Omni engine's
capabilities use. Upstream is imported only when asked.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

PROBED_SIZES = tuple(range(1, 9))
# Upstream's own switch (custom_pipeline_args / $MAGI2_ALLOW_UNSUPPORTED_TOPOLOGY) that lifts only
# the qualified-worker-count check, so a probe with it asks the validator's other rules alone.
BRING_UP = {"custom_pipeline_args": {"magi2_allow_unsupported_topology": True}}


@dataclass(frozen=True)
class TopologyRules:
    query_heads: int
    kv_heads: int
    moe_heads: int
    ulysses_degrees: tuple[int, ...]  # SP degrees the validator accepts, worker count aside (the heads rule)
    qualified_world_sizes: tuple[int, ...]  # workers the validator qualifies (SP-only probes)
    offload_world_size: int | None  # the single-worker layerwise-offload path


def refusal(parallel, **config_kwargs: Any) -> str | None:
    """Upstream's ``_validate_native_topology`` on a real ``OmniDiffusionConfig``; None when accepted."""

    from vllm_omni.diffusion.data import OmniDiffusionConfig
    from vllm_omni.diffusion.models.magi2 import pipeline_magi2

    config = OmniDiffusionConfig.from_kwargs(model="sand-ai/MAGI-2-preview", model_class_name="Magi2Pipeline",
                                             parallel_config=parallel, **config_kwargs)
    # The validator's last check compares the layout with *this* process's torch.distributed
    # world; here (the studio / CLI process, not a worker) that world is unrelated, e.g. the
    # embedded engine's own one-process group. Show the validator no world.
    real_dist = pipeline_magi2.dist
    pipeline_magi2.dist = _NoWorld(real_dist)
    try:
        pipeline_magi2._validate_native_topology(config)
    except ValueError as err:
        return str(err)
    finally:
        pipeline_magi2.dist = real_dist
    return None


class _NoWorld:
    """``torch.distributed`` as seen from a process that is not part of the worker world."""

    def __init__(self, dist) -> None:
        self._dist = dist

    def __getattr__(self, name: str):
        return getattr(self._dist, name)

    @staticmethod
    def is_initialized() -> bool:
        return False


def probe(ulysses: int = 1, cfg: int = 1, vae_patch_parallel_size: int = 1, *, expert_parallel: bool = False,
          **config_kwargs: Any) -> str | None:
    """:func:`refusal` for one SP x CFG layout (Ulysses = sequence parallel, as MAGI-2 requires)."""

    from vllm_omni.diffusion.data import DiffusionParallelConfig

    parallel = DiffusionParallelConfig(ulysses_degree=ulysses, sequence_parallel_size=ulysses, cfg_parallel_size=cfg,
                                       vae_patch_parallel_size=vae_patch_parallel_size,
                                       enable_expert_parallel=expert_parallel)
    return refusal(parallel, **config_kwargs)


@functools.cache
def upstream_rules() -> TopologyRules:
    from vllm_omni.diffusion.models.magi2.configuration_magi2 import MAGI2_PREVIEW_CONFIG as released

    return TopologyRules(
        query_heads=released.num_heads_q,
        kv_heads=released.num_heads_kv,
        moe_heads=released.moe.num_heads,
        ulysses_degrees=tuple(n for n in PROBED_SIZES if probe(n, **BRING_UP) is None),
        qualified_world_sizes=tuple(n for n in PROBED_SIZES if probe(n) is None),
        offload_world_size=1 if probe(1, enable_layerwise_offload=True) is None else None,
    )


def vae_patch_parallel_sizes(ulysses: int, cfg: int, **config_kwargs: Any) -> tuple[int, ...]:
    """The VAE patch-parallel sizes the validator accepts on this layout, worker count aside."""

    config_kwargs = {**BRING_UP, **config_kwargs}
    return tuple(size for size in range(1, ulysses * cfg + 1) if probe(ulysses, cfg, size, **config_kwargs) is None)
