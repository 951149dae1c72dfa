"""The one mechanism that installs magi2_kernels into vLLM-Omni 0.30.0's MAGI-2 modules.

Both the embedded CPU engine and the real engine's worker plugin call :func:`install_overrides`;
it replaces upstream names at the place each call resolves them (the table of patched names:
docs/kernels.md, "The override switch"). ``moe`` and ``routing`` share one patched method; with
only one of them on, the other half calls upstream's functions.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from . import attention_sink, mhc, moe, routing
from .platform import Platform, current_platform

ENV_VAR = "MAGI2_KERNELS"
KERNELS = ("moe", "routing", "sinkhorn", "mhc_mix", "mhc_pre", "mhc_projection", "attention_sink")
_PACKAGE = "vllm_omni.diffusion.models.magi2"
_OURS = {"ours", "on", "1", "true"}
_UPSTREAM = {"upstream", "off", "0", "false"}


class UpstreamMismatch(RuntimeError):
    """A name this module patches or calls is missing from the installed vLLM-Omni."""


@dataclass(frozen=True)
class _Target:
    module: str
    owner: str | None  # class name, or None for a module-level function
    attr: str

    def describe(self) -> str:
        return f"{_PACKAGE}.{self.module}." + (f"{self.owner}.{self.attr}" if self.owner else self.attr)


_MOE_FORWARD = _Target("mh_moe", "Magi2MultiHeadMoE", "_local_forward")
_TARGETS: dict[str, tuple[_Target, ...]] = {
    "moe": (_MOE_FORWARD,),
    "routing": (_MOE_FORWARD,),
    "sinkhorn": (_Target("layers", "MHCHandler", "compute_post_residual"),),
    "mhc_mix": (_Target("layers", "MHCHandler", "hyper_connect"),),
    "mhc_pre": (_Target("layers", "MHCHandler", "apply_pre"),),
    "mhc_projection": (_Target("layers", "MHCHandler", "compute_logits"),),
    "attention_sink": (_Target("attention", None, "packed_attention_with_sink"),
                       _Target("modeling_magi2", "Magi2Attention", "output")),
}
# Upstream names our replacements call or inspect at run time.
_REQUIRES: dict[str, tuple[_Target, ...]] = {
    "moe": (_Target("mh_moe", "Magi2MultiHeadMoE", "_route"), _Target("mh_moe", None, "global_sort_routes"),
            _Target("mh_moe", None, "triton_mh_moe_forward"), _Target("mh_moe", None, "torch_mh_moe_forward")),
    "routing": (_Target("mh_moe", "Magi2MultiHeadMoE", "_route"), _Target("mh_moe", None, "global_sort_routes"),
                _Target("mh_moe", None, "triton_mh_moe_forward"), _Target("mh_moe", None, "torch_mh_moe_forward")),
    "mhc_projection": (_Target("layers", "MultiModalityRMSNorm", "forward"),),
    "attention_sink": (_Target("attention", None, "vllm_flash_attn_varlen_with_lse"),
                       _Target("attention", None, "_resolve_flash_attn_version"),
                       _Target("attention", "VarlenHandler", "resolved")),
}

_originals: dict[_Target, object] = {}
_active: dict[str, bool] = dict.fromkeys(KERNELS, False)
_platform: Platform | None = None


def selection_from_env(default: str = "off") -> str:
    """The kernel selection from ``$MAGI2_KERNELS`` (``default`` when unset)."""

    return os.environ.get(ENV_VAR, default)


def parse_selection(selection: Mapping[str, str] | str) -> dict[str, bool]:
    """``"off"``, ``"on"``, ``"moe=ours,routing=upstream"`` or ``"on,routing=upstream"`` -> kernel: ours?

    A leading ``on``/``off`` sets the default for kernels not named (default ``off``); values are
    ``ours``/``on`` or ``upstream``/``off``. A mapping is read like the ``name=value`` items.
    """

    if isinstance(selection, Mapping):
        items, default = list(selection.items()), False
    else:
        items, default = [], False
        for index, token in enumerate(t.strip() for t in selection.split(",") if t.strip()):
            if "=" in token:
                key, value = (part.strip() for part in token.split("=", 1))
                items.append((key, value))
            elif index == 0 and token.lower() in ("on", "off"):
                default = token.lower() == "on"
            else:
                raise ValueError(f"bad {ENV_VAR} item {token!r}: expected on, off or kernel=ours|upstream")
    chosen = dict.fromkeys(KERNELS, default)
    for key, value in items:
        if key not in chosen:
            raise ValueError(f"unknown kernel {key!r} in {ENV_VAR}; known: {', '.join(KERNELS)}")
        value = str(value).strip().lower()
        if value not in _OURS | _UPSTREAM:
            raise ValueError(f"bad value {value!r} for kernel {key!r}: expected ours or upstream")
        chosen[key] = value in _OURS
    return chosen


def _owner(target: _Target):
    module = importlib.import_module(f"{_PACKAGE}.{target.module}")
    return getattr(module, target.owner) if target.owner else module


def _missing(targets) -> list[str]:
    missing = []
    for target in targets:
        try:
            owner = _owner(target)
        except (ImportError, AttributeError):
            missing.append(target.describe())
            continue
        if target in _originals:  # patched by us earlier: the name existed then; check it still does
            if target.attr not in vars(owner):
                missing.append(target.describe())
        elif not hasattr(owner, target.attr):
            missing.append(target.describe())
    return missing


def install_overrides(selection: Mapping[str, str] | str, platform: Platform | None = None) -> dict[str, str]:
    """Install our kernels into vLLM-Omni's MAGI-2 modules; returns what now runs, for the manifest.

    ``selection`` is ``"off"``, ``"on"``, per kernel (``"moe=ours,routing=upstream"``, or a mapping
    with those items) or ``"on,routing=upstream"``; see :func:`parse_selection`, and
    :func:`selection_from_env` for ``$MAGI2_KERNELS``. ``platform`` defaults to
    :func:`magi2_kernels.platform.current_platform`. Idempotent: each call sets every kernel to the
    given selection (kernels switched off get upstream's original back).

    Returns ``{kernel: "ours:triton" | "ours:reference" | "upstream", "platform": name}``.
    "ours:reference" is our PyTorch path (CPU without ``TRITON_INTERPRET=1``); on a GPU platform
    without Triton everything stays upstream. Raises :class:`UpstreamMismatch` (before patching
    anything) if a name an enabled kernel patches or calls is missing from the installed vLLM-Omni,
    and ``ValueError`` for a malformed selection.
    """

    global _platform
    chosen = parse_selection(selection)
    platform = platform or current_platform()
    if platform.name != "cpu" and not platform.triton:
        chosen = dict.fromkeys(KERNELS, False)
    wanted = [t for kernel, on in chosen.items() if on for t in (*_TARGETS[kernel], *_REQUIRES.get(kernel, ()))]
    missing = _missing(dict.fromkeys(wanted))
    if missing:
        raise UpstreamMismatch(
            "vLLM-Omni's MAGI-2 modules no longer have " + ", ".join(missing)
            + "; magi2_kernels.overrides targets vllm-omni 0.30.0"
        )
    _platform = platform
    _active.update(chosen)
    for target, replacement in _REPLACEMENTS.items():
        owner = _owner(target)
        on = any(chosen[k] for k, targets in _TARGETS.items() if target in targets)
        current = vars(owner).get(target.attr) if target.owner else getattr(owner, target.attr, None)
        if on:
            if not getattr(current, "__magi2_override__", False):
                _originals[target] = current
            setattr(owner, target.attr, replacement)
        elif target in _originals:
            setattr(owner, target.attr, _originals.pop(target))
    kind = "ours:triton" if platform.triton else "ours:reference"
    report = {kernel: (kind if on else "upstream") for kernel, on in chosen.items()}
    report["platform"] = platform.name
    return report


def active_selection() -> dict[str, bool]:
    """Which kernels are ours right now (a copy)."""

    return dict(_active)


def _override(target: _Target) -> Callable[[Callable], Callable]:
    def register(function: Callable) -> Callable:
        function.__magi2_override__ = True
        _REPLACEMENTS[target] = function
        return function

    return register


_REPLACEMENTS: dict[_Target, Callable] = {}


def _original(target: _Target) -> Callable:
    return _originals[target]


def _deterministic() -> bool:
    return os.environ.get("MAGI2_DETERMINISTIC", "0") == "1"


def _atomic_moe() -> bool:
    """Our MoE takes the atomic scatter only when asked (``MAGI2_MOE_ATOMIC=1``), never under
    ``MAGI2_DETERMINISTIC=1`` nor on a platform without atomics: deterministic is the default."""

    return (os.environ.get("MAGI2_MOE_ATOMIC", "0") == "1" and not _deterministic()
            and (_platform or current_platform()).atomic_moe)


def packed_w13(module) -> torch.Tensor:
    """The module's W13 in the kernel layout; the first call packs it and rebinds W_gate/W_up as views."""

    packed = getattr(module, "_magi2_w13", None)
    gate, up = module.W_gate, module.W_up
    if (packed is not None and gate.data_ptr() == packed[:, :, 0].data_ptr()
            and up.data_ptr() == packed[:, :, 1].data_ptr()):
        return packed
    with torch.no_grad():
        packed = moe.pack_w13(gate.detach(), up.detach())
        gate.data = packed[:, :, 0]
        up.data = packed[:, :, 1]
    module._magi2_w13 = packed
    return packed


def prepare_weights(model: torch.nn.Module) -> int:
    """Lay out W13 of every MAGI-2 MoE module of ``model`` now (after loading); returns how many."""

    mh_moe = importlib.import_module(f"{_PACKAGE}.mh_moe")
    modules = [m for m in model.modules() if isinstance(m, mh_moe.Magi2MultiHeadMoE)]
    for module in modules:
        packed_w13(module)
    return len(modules)


@_override(_MOE_FORWARD)
def _moe_local_forward(self, x_heads: torch.Tensor) -> torch.Tensor:
    mh_moe = importlib.import_module(f"{_PACKAGE}.mh_moe")
    if torch.compiler.is_compiling():
        return _original(_MOE_FORWARD)(self, x_heads)
    slots = None
    if _active["routing"] and self.config.score_func == "sigmoid":
        bias_source = (os.environ.get("MAGI2_ROUTER_BIAS_SOURCE") or "ema").strip().lower()
        bias = self.router.expert_bias if bias_source == "main" else self.router.expert_bias_ema
        routes = routing.route(
            x_heads, self.gate.view(self.local_num_heads, self.num_experts, self.d_head).float(),
            bias.view(self.local_num_heads, self.num_experts), self.top_k, route_norm=self.config.route_norm,
            route_scale=self.config.route_scale, platform=_platform,
        )
        gather_ids, probs, offsets, slots = routes.gather_ids, routes.probs, routes.offsets, routes.slots
    else:
        topk_probs, topk_ids = self._route(x_heads)
        gather_ids, probs, offsets = mh_moe.global_sort_routes(topk_probs, topk_ids, self.num_experts)
    if _active["moe"]:
        if slots is None:
            slots = routing.slots_from_csr(gather_ids, offsets, self.local_num_heads, x_heads.shape[0], self.top_k)
        return moe.moe_experts(x_heads, gather_ids, probs, offsets, slots, packed_w13(self), self.W_down,
                               atomic=_atomic_moe(), platform=_platform)
    if x_heads.is_cuda:  # upstream's own dispatch, unchanged
        return mh_moe.triton_mh_moe_forward(x_heads, gather_ids, probs, offsets, self.W_gate, self.W_up,
                                            self.W_down, deterministic=_deterministic())
    return mh_moe.torch_mh_moe_forward(x_heads, gather_ids, probs, offsets, self.W_gate, self.W_up, self.W_down)


_SINKHORN = _TARGETS["sinkhorn"][0]


@_override(_SINKHORN)
def _compute_post_residual(self, post, residual, *, out_dtype):
    if torch.compiler.is_compiling() or self.num_streams != 4:
        return _original(_SINKHORN)(self, post, residual, out_dtype=out_dtype)
    alpha_post, bias_post, post_logits = post
    alpha_residual, bias_residual, residual_logits = residual
    return mhc.post_residual(post_logits, residual_logits, alpha_post, bias_post, alpha_residual, bias_residual,
                             scale=self.matmul_scale, iterations=self.sinkhorn_iterations,
                             epsilon=self.sinkhorn_epsilon, out_dtype=out_dtype, platform=_platform)


_MIX = _TARGETS["mhc_mix"][0]


@_override(_MIX)
def _hyper_connect(self, residual_streams, branch_output, post_coefficients, residual_matrix):
    if torch.compiler.is_compiling() or self.num_streams != 4:
        return _original(_MIX)(self, residual_streams, branch_output, post_coefficients, residual_matrix)
    self._check_multi(residual_streams)
    if branch_output.ndim != 2 or branch_output.shape[-1] != self.hidden_size:
        raise ValueError("invalid mHC branch-output shape")
    return mhc.mix(residual_streams, branch_output, post_coefficients, residual_matrix, platform=_platform)


_PRE = _TARGETS["mhc_pre"][0]


@_override(_PRE)
def _apply_pre(self, streams, alpha_bias_logits, *, out_dtype=None):
    if torch.compiler.is_compiling() or self.num_streams != 4:
        return _original(_PRE)(self, streams, alpha_bias_logits, out_dtype=out_dtype)
    self._check_multi(streams)
    alpha, bias, logits = alpha_bias_logits
    return mhc.apply_pre(streams, alpha, bias, logits, scale=self.matmul_scale, out_dtype=out_dtype or streams.dtype,
                         platform=_platform)


_PROJECTION = _TARGETS["mhc_projection"][0]


@_override(_PROJECTION)
def _compute_logits(self, flattened, norm, phi_fused):
    layers = importlib.import_module(f"{_PACKAGE}.layers")
    rms = norm.func if isinstance(norm, functools.partial) else None
    foldable = (
        isinstance(rms, layers.MultiModalityRMSNorm)
        and rms.num_patterns == 1
        and rms.out_dtype == torch.float32
        and self.dtype == torch.float32
        and phi_fused.dtype == torch.float32
        and flattened.ndim == 2
        and flattened.shape[-1] == self.num_streams * self.hidden_size
    )
    if torch.compiler.is_compiling() or not foldable:
        return _original(_PROJECTION)(self, flattened, norm, phi_fused)
    dispatcher = norm.keywords.get("modality_dispatcher")
    modality_ids = None if rms.num_modality == 1 else dispatcher.permuted_modality_mapping
    fused = mhc.logits(flattened, rms.weight.view(rms.num_modality, -1), modality_ids, rms.eps, phi_fused,
                       num_streams=self.num_streams, platform=_platform)
    n = self.num_streams
    pre, post, residual = torch.split(fused, (n, n, n * n), dim=-1)
    return pre, post, residual.view(-1, n, n)


_SINK = _TARGETS["attention_sink"][0]
_GATE = _TARGETS["attention_sink"][1]


@_override(_SINK)
def _packed_attention_with_sink(q, k, v, varlen, *, softcap=-1.0, sink=None):
    attention = importlib.import_module(f"{_PACKAGE}.attention")
    cu_q, cu_k, max_q, max_k = varlen.resolved(q.shape[0], k.shape[0])
    cu_q = cu_q.to(device=q.device, dtype=torch.int32).contiguous()
    cu_k = cu_k.to(device=q.device, dtype=torch.int32).contiguous()
    if _platform is not None and _platform.name in ("cuda", "musa"):
        out, lse = attention.vllm_flash_attn_varlen_with_lse(
            q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k, softcap=softcap,
            deterministic=_deterministic(), fa_version=attention._resolve_flash_attn_version(),
        )
    else:
        out, lse = attention_sink.reference_varlen_attention(q, k, v, cu_q, cu_k, softcap=softcap,
                                                             out_dtype=torch.float32)
    if sink is None or sink.numel() == 0:
        return out.to(q.dtype)
    return attention_sink.sink_gate(out, lse, sink, None, out_dtype=q.dtype, platform=_platform)


@_override(_GATE)
def _attention_output(self, attention, gates, modality_dispatcher):
    if torch.compiler.is_compiling():
        return _original(_GATE)(self, attention, gates, modality_dispatcher)
    gated = attention_sink.sink_gate(attention, None, None, gates, modality_dispatcher.permute_mapping,
                                     out_dtype=self.config.params_dtype, platform=_platform)
    return self.linear_proj(gated.reshape(-1, self.q_size), modality_dispatcher)
