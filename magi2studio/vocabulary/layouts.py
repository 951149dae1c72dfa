"""Parallel layouts: Ulysses SP degree x CFG size x optional head-sharded EP degree.

Written ``spN-cfgM[-epK][-offload]``. ``check_shape`` holds for every engine and imports
nothing from upstream. ``rules_for_real_model`` checks the real checkpoint's constraints: the ones vLLM-Omni's
MAGI-2 pipeline validates, asked of upstream through :mod:`.topology`, plus the MUSA report's
EP, memory and 1080p findings, which upstream 0.30.0 does not state. An engine adds its own
limits on top.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..errors import InputError
from .tiers import Tier

# Published sizes (upstream states no memory figures): the Preview transformer is about 212 GiB
# in bf16; routed experts are ~95%.
TRANSFORMER_GIB = 212.0
ROUTED_FRACTION = 0.95
# Activations, workspace, staged auxiliaries and the NCCL/MCCL buffers, per GPU (MUSA report: EP2
# asks for 960 MiB more with 723 MiB left on 80 GB cards, so keep a conservative margin).
WORKING_SET_GIB = 12.0

_LAYOUT_RE = re.compile(r"^sp(\d+)-cfg(\d+)(?:-ep(\d+))?(-offload)?$")


@dataclass(frozen=True)
class Layout:
    sp: int = 1
    cfg: int = 1
    ep: int | None = None
    offload: bool = False
    vae_pp: int | None = None

    @property
    def name(self) -> str:
        text = f"sp{self.sp}-cfg{self.cfg}"
        if self.ep is not None:
            text += f"-ep{self.ep}"
        if self.offload:
            text += "-offload"
        return text

    @property
    def world_size(self) -> int:
        return self.sp * self.cfg

    @property
    def moe_shards(self) -> int:
        """How many ways the MoE heads are split.

        Without an explicit EP degree the head axis follows the Ulysses group when TP=1
        (MUSA report 5.3: turning the EP flag off does not turn head sharding off).
        """
        return self.ep if self.ep is not None else self.sp

    def vae_patch_parallel(self, tier: Tier) -> int:
        if self.vae_pp is not None:
            return self.vae_pp
        return self.world_size if tier.refined else 1

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "ulysses_degree": self.sp,
            "cfg_parallel_size": self.cfg,
            "expert_parallel_size": self.ep,
            "layerwise_offload": self.offload,
            "world_size": self.world_size,
            "moe_shards": self.moe_shards,
        }


PRESETS: dict[str, tuple[Layout, str]] = {
    "sp8-cfg1-ep4": (Layout(8, 1, 4), "8 GPUs, the MUSA report's fastest: 565 ms/step at 272p"),
    "sp8-cfg1-ep8": (Layout(8, 1, 8), "8 GPUs, EP8 pads 12 heads to 16 (two GPUs idle): 633 ms/step"),
    "sp8-cfg1": (Layout(8, 1), "8 GPUs, heads follow the Ulysses group: 698 ms/step"),
    "sp4-cfg2": (Layout(4, 2), "8 GPUs, CFG branches on separate GPUs"),
    "sp4-cfg2-ep4": (Layout(4, 2, 4), "8 GPUs, CFG-parallel with explicit EP4"),
    "sp4-cfg1-ep4": (Layout(4, 1, 4), "4 GPUs, EP4 (3 heads per GPU)"),
    "sp2-cfg2": (Layout(2, 2), "4 GPUs, SP2 x CFG2"),
    "sp2-cfg1": (Layout(2, 1), "2 ranks: Ulysses only (embedded engine)"),
    "sp1-cfg2": (Layout(1, 2), "2 ranks: CFG-parallel only (embedded engine)"),
    "sp1-cfg1": (Layout(1, 1), "one process (embedded engine)"),
    "sp1-cfg1-offload": (Layout(1, 1, offload=True), "1 GPU with layerwise offload"),
}


def parse_layout(text: str) -> Layout:
    """Parse a preset name or ``spN-cfgM[-epK][-offload]``."""

    raw = str(text).strip().lower()
    if raw in PRESETS:
        return PRESETS[raw][0]
    match = _LAYOUT_RE.match(raw)
    if not match:
        raise InputError(
            "layout",
            f"{text!r} is not a layout",
            "write spN-cfgM[-epK] (e.g. sp2-cfg1, sp1-cfg2, sp8-cfg1-ep4) or a preset: " + ", ".join(PRESETS),
        )
    sp, cfg = int(match[1]), int(match[2])
    ep = int(match[3]) if match[3] else None
    layout = Layout(sp, cfg, ep, offload=bool(match[4]))
    check_shape(layout)
    return layout


def check_shape(layout: Layout) -> None:
    """Rules that hold for every engine, checked as a layout is parsed (without importing upstream).

    Upstream's validator states the CFG and single-worker offload rules too (``rules_for_real_model``
    asks it). It states no
    EP degree rule (vLLM-Omni 0.30.0 refuses ``enable_expert_parallel``): an EP degree dividing
    the Ulysses group is how the MUSA report's #8511 shards the MoE heads inside it.
    """

    if layout.sp < 1:
        raise InputError("layout", "the Ulysses degree must be at least 1", "use sp1 or more")
    if layout.cfg not in (1, 2):
        raise InputError("layout", f"cfg{layout.cfg}: MAGI-2 has exactly two CFG branches", "use cfg1 or cfg2")
    if layout.ep is not None:
        if layout.ep < 1:
            raise InputError("layout", "the EP degree must be at least 1", "use ep1 or more, or leave it out")
        if layout.sp % layout.ep:
            raise InputError(
                "layout",
                f"ep{layout.ep} does not divide the Ulysses group of {layout.sp}",
                f"pick an EP degree that divides {layout.sp}",
            )
    if layout.offload and layout.world_size != 1:
        raise InputError(
            "layout", "layerwise offload is a single-worker path", "use sp1-cfg1-offload, or drop -offload"
        )


def padded_moe_heads(heads: int, shards: int) -> int:
    return math.ceil(heads / shards) * shards


def idle_moe_ranks(heads: int, shards: int) -> int:
    """Ranks of the EP group that own only padding heads."""

    per_rank = math.ceil(heads / shards)
    return shards - math.ceil(heads / per_rank)


def memory_per_gpu_gib(layout: Layout) -> float:
    """Weights resident on the fullest GPU plus a working-set margin (published sizes)."""

    if layout.offload:
        return WORKING_SET_GIB + TRANSFORMER_GIB * (1 - ROUTED_FRACTION) / 4
    from .topology import upstream_rules

    moe_heads = upstream_rules().moe_heads
    routed = TRANSFORMER_GIB * ROUTED_FRACTION
    heads_per_rank = math.ceil(moe_heads / layout.moe_shards)
    return TRANSFORMER_GIB * (1 - ROUTED_FRACTION) + routed * heads_per_rank / moe_heads + WORKING_SET_GIB


def memory_fit_line(layout: Layout, gpu_gib: float) -> str:
    need = memory_per_gpu_gib(layout)
    verdict = "fits" if need <= gpu_gib else "does NOT fit"
    return f"{layout.name}: ~{need:.0f} GiB per GPU of {gpu_gib:.0f} GiB -> {verdict}"


def _either(sizes: tuple[int, ...]) -> str:
    return ", ".join(map(str, sizes[:-1])) + f" or {sizes[-1]}" if len(sizes) > 1 else str(sizes[0])


def rules_for_real_model(layout: Layout, tier: Tier, gpu_gib: float | None = None) -> list[str]:
    """Check a layout against the released checkpoint. Raises on a broken rule; returns warnings.

    Heads, worker counts, VAE patch-parallel and the MoE heads' EP padding are upstream's rules
    (:mod:`.topology`); the 1080p decode rule and the memory estimate are the MUSA report's.
    """

    from . import topology

    check_shape(layout)
    rules = topology.upstream_rules()
    warnings: list[str] = []
    if layout.sp not in rules.ulysses_degrees:
        raise InputError(
            "layout",
            f"the {rules.query_heads} query / {rules.kv_heads} KV attention heads do not divide by TPxSP={layout.sp}",
            f"use an Ulysses degree of {_either(rules.ulysses_degrees)}",
        )
    offload = rules.offload_world_size
    if not (layout.world_size in rules.qualified_world_sizes or (layout.offload and layout.world_size == offload)):
        raise InputError(
            "layout",
            f"world size SPxCFG={layout.world_size}: vLLM-Omni qualifies MAGI-2 on "
            f"{_either(rules.qualified_world_sizes)} workers" + (f", or {offload} with layerwise offload" if offload
                                                                 else ""),
            f"use a {_either(rules.qualified_world_sizes)}-GPU layout (e.g. sp8-cfg1-ep4, sp4-cfg2, sp4-cfg1-ep4)"
            + (" or sp1-cfg1-offload" if offload else ""),
        )
    vae_pp = layout.vae_patch_parallel(tier)
    offload_kwargs = {"enable_layerwise_offload": layout.offload}
    refused = topology.probe(layout.sp, layout.cfg, vae_pp, **offload_kwargs, **topology.BRING_UP)
    if refused:
        sizes = topology.vae_patch_parallel_sizes(layout.sp, layout.cfg, **offload_kwargs)
        raise InputError("layout", f"VAE patch-parallel {vae_pp} on {layout.name}: {refused.rstrip('.')}",
                         f"use vae_pp={_either(sizes)}")
    # vLLM-Omni 0.30.0 has no 1080p stage, so it states no rule for it: this one is the MUSA report's.
    if tier.refined and vae_pp != layout.world_size:
        raise InputError(
            "layout",
            f"1080p decode needs VAE patch-parallel = world size ({layout.world_size}); with {vae_pp} "
            "the decode dies (MUSA report A.4)",
            f"set the VAE patch-parallel size to {layout.world_size}",
        )
    shards, heads = layout.moe_shards, rules.moe_heads
    if shards > 1 and heads % shards:  # upstream pads the MoE heads to a multiple of the EP group (mh_moe.py)
        idle = idle_moe_ranks(heads, shards)
        warnings.append(
            f"EP{shards} pads the {heads} MoE heads to {padded_moe_heads(heads, shards)}"
            + (f": {idle} GPUs hold no real head (idle in the MoE)" if idle else "")
        )
    if gpu_gib is not None and memory_per_gpu_gib(layout) > gpu_gib:
        raise InputError(
            "layout",
            f"{memory_fit_line(layout, gpu_gib)}: each GPU would hold {math.ceil(heads / shards)} of {heads} MoE "
            f"heads' experts (routed experts are {ROUTED_FRACTION:.0%} of the {TRANSFORMER_GIB:.0f} GiB transformer)",
            "raise the EP degree (EP >= 4 on 80 GB cards)",
        )
    return warnings
