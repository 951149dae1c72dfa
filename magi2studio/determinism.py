"""The deterministic environment of the MUSA report's appendix A.5, owned in one place.

Engines apply it before torch starts; the image sets it as ENV; the manifest records it;
``magi2studio env`` prints it as shell exports.
"""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from collections.abc import MutableMapping

# Fixed values. TORCHINDUCTOR_CACHE_DIR is added per run (a fresh, empty cache).
DETERMINISTIC_ENV: dict[str, str] = {
    # Keep only one Inductor config per reduction, so compile-time benchmarking cannot pick
    # a different reduction order run to run (no measurable cost: 697.8 vs 700-703 ms).
    "TORCHINDUCTOR_FORCE_FILTER_REDUCTION_CONFIGS": "1",
    # Set, but it has no effect on MAGI-2: the pipeline calls
    # torch.use_deterministic_algorithms(magi2_deterministic) during construction.
    "TORCHINDUCTOR_DETERMINISTIC": "1",
    # cuBLAS picks workspace-dependent algorithms otherwise.
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    # Workers are spawned, never forked, so no CUDA/MUSA state or RNG is inherited.
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    # CPU kernels: the AVX2/AVX-512 builds run full vectors and the tail of a tensor through
    # different code (vector vs scalar transcendental functions differ in the last bit), so a
    # token's result depends on where it lands in a tensor, and layouts place tokens
    # differently. The portable build treats every element alike: with it one process, SP2,
    # CFG2 and SP2xCFG2 are bit-identical (docs/performance.md; about the same speed on the
    # tiny model). Read once when torch starts; GPU kernels are unaffected.
    "ATEN_CPU_CAPABILITY": "default",
}

# What the embedded engine does on top of the environment while sampling, recorded in its runs'
# manifests (resolved.layout_invariant_products) when deterministic is on.
LAYOUT_INVARIANT_PRODUCTS = (
    "fp32 matrix products (F.linear, @, mm, bmm, einsum) computed as exact fp64 slice products "
    "(magi2studio/engines/embedded/exact_products.py): a row's result does not depend on the row "
    "count, the BLAS kernel, the thread count or the CPU's instruction set, so every layout gives "
    "one process's latents"
)

WHAT_HASHES_PROVE = (
    "With these settings, identical output hashes prove identical outputs. Differing hashes do "
    "not prove that the numerics changed: whether a GEMM is padded (pad_mm) is still decided by "
    "compile-time benchmarking, so a difference needs a closer look (compare against an fp64 "
    "reference or repeat the run)."
)


def deterministic_env(cache_dir: str | None = None) -> dict[str, str]:
    """The variables for one run; ``cache_dir`` defaults to a new empty temp folder."""

    env = dict(DETERMINISTIC_ENV)
    env["TORCHINDUCTOR_CACHE_DIR"] = cache_dir or tempfile.mkdtemp(prefix="magi2-inductor-")
    return env


def apply(environ: MutableMapping[str, str] | None = None, cache_dir: str | None = None) -> dict[str, str]:
    """Set the deterministic environment (before torch is imported) and return what was set."""

    target = os.environ if environ is None else environ
    env = deterministic_env(cache_dir)
    target.update(env)
    return env


def apply_defaults(environ: MutableMapping[str, str] | None = None) -> None:
    """Set the fixed values the caller has not set (the CLI does this before torch starts)."""

    target = os.environ if environ is None else environ
    for key, value in DETERMINISTIC_ENV.items():
        target.setdefault(key, value)


def cpu_capability() -> str | None:
    """The CPU kernel build torch actually dispatches to, once torch has started."""

    torch = sys.modules.get("torch")
    return torch.backends.cpu.get_cpu_capability() if torch is not None else None


def as_exports(env: dict[str, str] | None = None) -> str:
    env = env if env is not None else {**DETERMINISTIC_ENV, "TORCHINDUCTOR_CACHE_DIR": "$(mktemp -d)"}
    lines = []
    for key, value in env.items():
        shown = value if value.startswith("$(") else shlex.quote(value)
        lines.append(f"export {key}={shown}")
    return "\n".join(lines)


def recorded(environ: MutableMapping[str, str] | None = None) -> dict[str, str | None]:
    """What is in force now, for the manifest and ``doctor``."""

    source = os.environ if environ is None else environ
    keys = [*DETERMINISTIC_ENV, "TORCHINDUCTOR_CACHE_DIR"]
    return {key: source.get(key) for key in keys}
