"""Side-by-side benchmark and full-shape correctness of magi2_kernels vs vLLM-Omni 0.30.0's kernels.

Runs upstream (its ``mh_moe.py`` / ``layers/mhc.py`` loaded from the unpacked vllm-omni wheel with
``vllm.triton_utils``, ``vllm.logger``, ``vllm_omni.platforms`` and ``CustomOp`` stubbed, as
``../shared/baselines/bench_upstream_mh_moe.py`` does) and ours in one process on the same inputs.
Every MoE shape runs three routing distributions (``ROUTING_DRAWS``: today's saturated default,
balanced, Zipf-skewed; fixed seeds) against vLLM-Omni's kernel, ``torch._grouped_mm`` (the two
GEMMs alone, and a full path) and the same-FLOP dense cuBLAS pair, with ratios. Full-shape
correctness is checked in the same run; a failed check or section makes the exit status 1.

    python scripts/bench_kernels.py --upstream-site /tmp/vo [--sweep] [--out FOLDER]

Writes ``FOLDER/kernels-<card>-<date>.json``, the card read from its device name (default folder outside
the checkout). ``--smoke`` runs everything at tiny shapes (CPU: set TRITON_INTERPRET=1) to check the script.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import re
import logging
import os
import sys
import tempfile
import time
import traceback
import types
from dataclasses import replace

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernels"))

from magi2_kernels import attention_sink, mhc, moe, routing  # noqa: E402
from magi2_kernels.platform import GemmConfig, current_platform  # noqa: E402

E, TOP_K, D_HEAD, D_EXPERT = 256, 6, 256, 1280
DTYPE = torch.bfloat16  # fp16 under --smoke: the interpreter has no bf16 atomics (upstream kernel)
SHAPES = [("ep4_local_272p", 14808, 3), ("full_heads_272p", 15015, 12), ("ep4_local_540p", 58000, 3)]
SMOKE_SHAPES = [("smoke_a", 40, 3), ("smoke_b", 33, 2)]
W13_SWEEP = [
    # (block_m, block_n, block_k, warps, stages, n-blocks per program); block_k == 256: x tile resident,
    # block_k < 256: flattened (n-block, k-step) loop. 40 x 32 = 20 x 64 = 1280: one program per row tile.
    GemmConfig(128, 32, 256, 8, 3, 40), GemmConfig(128, 32, 256, 4, 3, 40), GemmConfig(128, 32, 256, 8, 4, 40),
    GemmConfig(128, 32, 256, 8, 2, 40), GemmConfig(128, 64, 256, 8, 3, 20), GemmConfig(128, 64, 256, 8, 2, 20),
    GemmConfig(64, 32, 256, 4, 3, 40), GemmConfig(64, 64, 256, 4, 3, 20), GemmConfig(128, 32, 128, 8, 3, 40),
    GemmConfig(128, 64, 128, 8, 3, 20), GemmConfig(128, 32, 256, 8, 3, 20), GemmConfig(128, 64, 256, 8, 2, 10),
    GemmConfig(128, 32, 256, 8, 4, 20),
    # pair_dot: gate and up of block_n columns in one 2*block_n-wide dot (x tile read once per step).
    GemmConfig(128, 64, 256, 8, 2, 20, True), GemmConfig(128, 32, 256, 8, 3, 40, True),
    GemmConfig(128, 32, 256, 8, 4, 40, True), GemmConfig(128, 64, 256, 4, 2, 20, True),
    GemmConfig(128, 128, 256, 8, 1, 10, True), GemmConfig(64, 64, 256, 4, 3, 20, True),
]
W2_SWEEP = [
    GemmConfig(128, 256, 64, 8, 4), GemmConfig(128, 256, 64, 8, 3), GemmConfig(128, 128, 64, 8, 4),
    GemmConfig(128, 128, 64, 4, 4), GemmConfig(64, 256, 64, 4, 4), GemmConfig(128, 256, 128, 8, 3),
    GemmConfig(128, 128, 128, 8, 3), GemmConfig(256, 128, 64, 8, 3), GemmConfig(128, 256, 32, 8, 5),
]


def load_upstream(site: str) -> tuple[types.ModuleType, types.ModuleType]:
    """vLLM-Omni 0.30.0's mh_moe and layers/mhc modules from the unpacked wheel, without vLLM."""

    vt = types.ModuleType("vllm.triton_utils")
    vt.HAS_TRITON, vt.tl, vt.triton = True, tl, triton
    vlog = types.ModuleType("vllm.logger")
    vlog.init_logger = logging.getLogger
    vllm = types.ModuleType("vllm")
    vllm.triton_utils, vllm.logger = vt, vlog

    class _Platform:
        def get_device_capability(self):
            major, minor = torch.cuda.get_device_capability() if torch.cuda.is_available() else (9, 0)
            return types.SimpleNamespace(major=major, minor=minor)

        def is_cuda(self):
            return torch.cuda.is_available()

    platforms = types.ModuleType("vllm_omni.platforms")
    platforms.current_omni_platform = _Platform()
    custom_op = types.ModuleType("vllm_omni.diffusion.layers.custom_op")
    custom_op.CustomOp = type("CustomOp", (), {})
    sys.modules.update({"vllm": vllm, "vllm.triton_utils": vt, "vllm.logger": vlog,
                        "vllm_omni.platforms": platforms, "vllm_omni.diffusion.layers.custom_op": custom_op})
    for name in ["vllm_omni", "vllm_omni.diffusion", "vllm_omni.diffusion.models", "vllm_omni.diffusion.layers",
                 "vllm_omni.diffusion.models.magi2"]:
        package = types.ModuleType(name)
        package.__path__ = []
        sys.modules[name] = package
    root = os.path.join(site, "vllm_omni", "diffusion")

    def load(name: str, path: str) -> types.ModuleType:
        spec = importlib.util.spec_from_file_location(name, os.path.join(root, path))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    load("vllm_omni.diffusion.models.magi2.parallel", "models/magi2/parallel.py")
    return load("vllm_omni.diffusion.models.magi2.mh_moe", "models/magi2/mh_moe.py"), load(
        "vllm_omni.diffusion.layers.mhc", "layers/mhc.py")


def bench(fn, smoke: bool, rep: int = 200) -> float:
    """Median milliseconds (triton.testing.do_bench on the GPU; one timed call under the interpreter)."""

    if smoke:
        fn()
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    return float(triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median"))


def bench_graph(fn, smoke: bool, calls: int = 20) -> float | None:
    """Median ms per call from replaying a CUDA graph of ``calls`` calls: device time without the
    host's launch overhead, which dominates do_bench for kernels of a few microseconds."""

    if smoke or not torch.cuda.is_available():
        return None
    try:
        return _graph_ms(fn, calls)
    except Exception as exc:  # noqa: BLE001 - an uncapturable function gets no graph time, noted
        print(f"graph timing failed: {type(exc).__name__}: {exc}"[:300], flush=True)
        return None


def _graph_ms(fn, calls: int) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return float(triton.testing.do_bench(graph.replay, warmup=25, rep=200, return_mode="median")) / calls


def count_launches(fn) -> int:
    if not torch.cuda.is_available():
        return -1
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def kernel_breakdown(fn) -> dict[str, float]:
    """Device microseconds per kernel name for one call (torch profiler)."""

    if not torch.cuda.is_available():
        return {}
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.key[:80]: round(e.device_time_total, 2) for e in prof.key_averages() if e.device_time_total > 0}


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).norm() / ref.norm())


ROUTINGS = ("default", "balanced", "skewed")
ZIPF_EXPONENT = 1.0
ROUTING_DRAWS = {
    "default": "the gate logits of x @ randn gate vectors (std ~16: fp32 sigmoids saturate, the 0.01-scale bias "
               "decides the top-6; few experts get rows), through vLLM-Omni's own routing",
    "balanced": "each (token, head) takes 6 distinct experts uniformly at random (Gumbel top-k, seed 4321 + shape)",
    "skewed": f"each (token, head) takes 6 distinct experts drawn without replacement with probability proportional "
              f"to 1 / (rank + 1)^{ZIPF_EXPONENT} (Zipf), ranks a random permutation per head (Gumbel top-k, "
              f"seed 4321 + shape)",
    "probs": "balanced/skewed: sigmoid(2 randn) of the 6 picks, L1-normalised, as route_norm does",
}


def moe_problem(tokens: int, heads: int, dev: str, gen: torch.Generator):
    x = torch.randn(tokens, heads, D_HEAD, device=dev, generator=gen).to(DTYPE)
    w_gate = (torch.randn(heads * E, D_HEAD, D_EXPERT, device=dev, generator=gen) / 16).to(DTYPE)
    w_up = (torch.randn(heads * E, D_HEAD, D_EXPERT, device=dev, generator=gen) / 16).to(DTYPE)
    w_down = (torch.randn(heads * E, D_EXPERT, D_HEAD, device=dev, generator=gen) / 36).to(DTYPE)
    gate = torch.randn(heads, E, D_HEAD, device=dev, generator=gen)
    bias = torch.randn(heads, E, device=dev, generator=gen) * 0.01
    return x, w_gate, w_up, w_down, gate, bias


def drawn_topk(kind: str, tokens: int, heads: int, dev: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[H, S, K] probs and expert ids for the balanced or skewed distribution (ROUTING_DRAWS)."""

    gen = torch.Generator(device=dev).manual_seed(seed)
    log_popularity = torch.zeros(heads, E, device=dev)
    if kind == "skewed":
        ranks = torch.argsort(torch.rand(heads, E, device=dev, generator=gen), dim=1).float()
        log_popularity = -ZIPF_EXPONENT * torch.log1p(ranks)
    uniform = torch.rand(heads, tokens, E, device=dev, generator=gen).clamp_(min=1e-20)
    ids = (log_popularity[:, None, :] - torch.log(-torch.log(uniform))).topk(TOP_K, dim=-1).indices
    del uniform
    scores = torch.sigmoid(2 * torch.randn(heads, tokens, TOP_K, device=dev, generator=gen))
    return scores / scores.sum(-1, keepdim=True), ids


def routing_stats(offsets: torch.Tensor, heads: int) -> dict:
    counts = torch.diff(offsets.long()).double()
    top = torch.sort(counts, descending=True).values
    return dict(experts_used=int((counts > 0).sum()), experts=heads * E, max_rows=int(counts.max()),
                mean_rows=float(counts.mean()),
                top10pct_share=float(top[: max(1, top.numel() // 10)].sum() / counts.sum()))


class GroupedMM:
    """The torch._grouped_mm anchor (CUTLASS, bf16): at most 1023 groups a call, so heads go in chunks.

    Chunk bounds and the gather index are read once at set-up (host), outside the timings.
    """

    def __init__(self, x, gather_ids, probs, offsets, w13, w_down, heads):
        tokens = x.shape[0]
        counts = torch.diff(offsets.long())
        head_of_row = torch.repeat_interleave(torch.arange(heads, device=x.device), counts.view(heads, E).sum(1))
        self.flat_index = gather_ids.long() * heads + head_of_row
        self.x_flat = x.reshape(tokens * heads, D_HEAD).to(torch.bfloat16)
        self.probs = probs.float()[:, None]
        self.w13 = w13.reshape(heads * E, D_HEAD, 2 * D_EXPERT).to(torch.bfloat16)
        self.w2 = w_down.to(torch.bfloat16)
        self.shape = (tokens, heads)
        bounds = offsets.tolist()
        per_call = max(1, 1023 // E)
        self.chunks = []
        for h0 in range(0, heads, per_call):
            g0, g1 = h0 * E, min(heads, h0 + per_call) * E
            offs = (offsets[g0 + 1:g1 + 1] - bounds[g0]).to(torch.int32)
            self.chunks.append((g0, g1, bounds[g0], bounds[g1], offs))
        self.rows = self.x_flat[self.flat_index]
        self.hidden = torch.randn(gather_ids.numel(), D_EXPERT, device=x.device, dtype=torch.bfloat16)

    def gemms(self):
        """The two expert GEMMs alone, on pre-gathered rows and a ready hidden tensor (one pair per chunk)."""

        return [(torch._grouped_mm(self.rows[r0:r1], self.w13[g0:g1], offs=offs),
                 torch._grouped_mm(self.hidden[r0:r1], self.w2[g0:g1], offs=offs))
                for g0, g1, r0, r1, offs in self.chunks]

    def full(self):
        """Per chunk: gather -> grouped W13 -> SwiGLU7 (torch) -> grouped W2 -> x prob -> index_add (fp32); cast."""

        out = torch.zeros(self.x_flat.shape, device=self.x_flat.device, dtype=torch.float32)
        for g0, g1, r0, r1, offs in self.chunks:
            index = self.flat_index[r0:r1]
            h13 = torch._grouped_mm(self.x_flat[index], self.w13[g0:g1], offs=offs)
            hidden = moe.swiglu7_reference(h13[:, :D_EXPERT], h13[:, D_EXPERT:])
            out.index_add_(0, index, torch._grouped_mm(hidden, self.w2[g0:g1], offs=offs).float() * self.probs[r0:r1])
        return out.view(*self.shape, D_HEAD).to(DTYPE)


def variant_platforms() -> dict:
    """The changes of issue 15, each switchable: issue 3's final state, then one flag at a time."""

    base = current_platform()
    issue3 = dict(w13=GemmConfig(128, 64, 256, 8, 2, 10), w2=GemmConfig(128, 256, 64, 8, 4))
    return {
        "issue3_state": (replace(base, tma=False, fast_sigmoid=False), issue3),
        "new_w13_tiles_only": (replace(base, tma=False, fast_sigmoid=False), {}),
        "plus_fast_sigmoid": (replace(base, tma=False), {}),
        "plus_tma_no_fast_sigmoid": (replace(base, fast_sigmoid=False), {}),
        "final": (base, {}),
    }


def csr_for(kind, x, gate, bias, heads, tokens, dev, mh):
    if kind == "default":
        logits = torch.einsum("shd,hed->hse", x.float(), gate)
        probs, ids = mh.compute_topk_probs_and_indices(logits, TOP_K, expert_bias=bias)
        del logits
    else:
        probs, ids = drawn_topk(kind, tokens, heads, dev, 4321 + tokens + heads)
    gather_ids, sorted_probs, offsets = mh.global_sort_routes(probs, ids, E)
    slots = routing.slots_from_csr(gather_ids, offsets, heads, tokens, TOP_K)
    return gather_ids, sorted_probs, offsets, slots


def run_moe(args, mh, dev, smoke, results, checks, save):
    gen = torch.Generator(device=dev).manual_seed(1234)
    shapes = SMOKE_SHAPES if smoke else SHAPES
    results["routing_draws"] = ROUTING_DRAWS
    results["configs_used"] = dict(w13=current_platform().w13.as_dict(), w2=current_platform().w2.as_dict())
    for index, (label, tokens, heads) in enumerate(shapes):
        x, w_gate, w_up, w_down, gate, bias = moe_problem(tokens, heads, dev, gen)
        w13 = moe.pack_w13(w_gate, w_up)
        del w_gate, w_up
        up_gate, up_up = w13[:, :, 0], w13[:, :, 1]  # views: upstream's kernel takes strided weights

        def upstream_routing():
            logits = torch.einsum("shd,hed->hse", x.float(), gate)
            probs, ids = mh.compute_topk_probs_and_indices(logits, TOP_K, expert_bias=bias)
            return mh.global_sort_routes(probs, ids, E)

        def our_routing():
            return routing.route(x, gate, bias, TOP_K)

        up_ids, up_probs, up_offsets = upstream_routing()
        ours = our_routing()
        checks.append(dict(check=f"routing_{label}", offsets_equal=bool(torch.equal(ours.offsets.long(), up_offsets)),
                           gather_ids_equal=bool(torch.equal(ours.gather_ids, up_ids)),
                           probs_rel_err=rel(ours.probs, up_probs)))
        routing_row = dict(upstream_routing_ms=bench(upstream_routing, smoke),
                           ours_routing_ms=bench(our_routing, smoke),
                           ours_routing_graph_ms=bench_graph(our_routing, smoke),
                           ours_routing_launches=count_launches(our_routing),
                           upstream_routing_launches=count_launches(upstream_routing))
        end_to_end = rel(moe.moe_experts(x, ours.gather_ids, ours.probs, ours.offsets, ours.slots, w13, w_down),
                         moe.reference_moe(x, up_ids, up_probs, up_offsets, w13, w_down).float())
        checks.append(dict(check=f"moe_{label}_ours_routing_end_to_end", rel_err=end_to_end))
        del ours, up_ids, up_probs, up_offsets
        routes = tokens * heads * TOP_K
        flops = moe.moe_flops(routes, D_HEAD, D_EXPERT)
        a = torch.randn(routes, D_HEAD, device=dev, dtype=DTYPE)
        b = torch.randn(D_HEAD, 2 * D_EXPERT, device=dev, dtype=DTYPE)
        c = torch.randn(routes, D_EXPERT, device=dev, dtype=DTYPE)
        d = torch.randn(D_EXPERT, D_HEAD, device=dev, dtype=DTYPE)
        dense_ms = bench(lambda: (a @ b, c @ d), smoke)
        a = b = c = d = None  # free them (the lambda above is done with them)
        row = dict(label=label, tokens=tokens, heads=heads, routes=routes, gflop=flops / 1e9, dense_ms=dense_ms,
                   dense_tflops=flops / dense_ms / 1e9, **routing_row, routing={})
        if args.sweep and index == 0:
            csr = csr_for("balanced", x, gate, bias, heads, tokens, dev, mh)
            run_variants(results, x, csr, w13, w_down, smoke)
            best13, best2 = run_sweep(results, x, csr, w13, w_down, smoke)
            results["configs_used"] = dict(w13=best13.as_dict(), w2=best2.as_dict())
            del csr
        for kind in ROUTINGS:
            try:
                row["routing"][kind] = run_routing(mh, smoke, results, checks, label, kind, x, gate, bias, w13, w_down,
                                                   up_gate, up_up, flops, dense_ms, dev)
            except Exception:  # noqa: BLE001 - keep the other distributions' numbers; the run still fails
                results.setdefault("errors", []).append(traceback.format_exc())
                traceback.print_exc()
            save()
        row["w13_config"], row["w2_config"] = results["configs_used"]["w13"], results["configs_used"]["w2"]
        results["rows"].append(row)
        save()
        x = w13 = w_down = up_gate = up_up = None  # free them before the next shape
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def run_routing(mh, smoke, results, checks, label, kind, x, gate, bias, w13, w_down, up_gate, up_up, flops,
                dense_ms, dev) -> dict:
    """One (shape, routing distribution): checks, then ours / vLLM-Omni / grouped_mm timings and ratios."""

    tokens, heads = x.shape[:2]
    w13_cfg = GemmConfig(**results["configs_used"]["w13"])
    w2_cfg = GemmConfig(**results["configs_used"]["w2"])
    csr = csr_for(kind, x, gate, bias, heads, tokens, dev, mh)
    ids, probs, offsets, slots = csr

    def ours_det(ids=ids, probs=probs, offsets=offsets, slots=slots):
        return moe.moe_experts(x, ids, probs, offsets, slots, w13, w_down, w13_config=w13_cfg, w2_config=w2_cfg)

    def ours_atomic(ids=ids, probs=probs, offsets=offsets, slots=slots):
        return moe.moe_experts(x, ids, probs, offsets, slots, w13, w_down, atomic=True, w13_config=w13_cfg,
                               w2_config=w2_cfg)

    def upstream_atomic(ids=ids, probs=probs, offsets=offsets):
        return mh.triton_mh_moe_forward(x, ids, probs, offsets, up_gate, up_up, w_down)

    def upstream_det(ids=ids, probs=probs, offsets=offsets):
        return mh.triton_mh_moe_forward(x, ids, probs, offsets, up_gate, up_up, w_down, deterministic=True)

    grouped = GroupedMM(x, ids, probs, offsets, w13, w_down, heads)
    # Correctness at full shape in this run: fp32 reference on the same bf16 operands.
    ref = moe.reference_moe(x, ids, probs, offsets, w13, w_down, compute_dtype=torch.float32).float()
    out_d, out_d2 = ours_det(), ours_det()
    checks.append(dict(check=f"moe_{label}_{kind}", ours_det_rel_err=rel(out_d, ref),
                       ours_atomic_rel_err=rel(ours_atomic(), ref), upstream_rel_err=rel(upstream_atomic(), ref),
                       grouped_mm_full_rel_err=rel(grouped.full(), ref),
                       deterministic_bit_identical=bool(torch.equal(out_d, out_d2))))
    del ref, out_d, out_d2
    r = dict(ours_ms=bench(ours_det, smoke), ours_atomic_ms=bench(ours_atomic, smoke),
             upstream_ms=bench(upstream_atomic, smoke), upstream_deterministic_ms=bench(upstream_det, smoke),
             grouped_mm_gemms_ms=bench(grouped.gemms, smoke), grouped_mm_full_ms=bench(grouped.full, smoke),
             stats=routing_stats(offsets, heads))
    r["ours_tflops"] = flops / r["ours_ms"] / 1e9
    r["ours_vs_dense_speed"] = dense_ms / r["ours_ms"]
    r["speedup_vs_upstream"] = r["upstream_ms"] / r["ours_ms"]
    r["speedup_vs_upstream_deterministic"] = r["upstream_deterministic_ms"] / r["ours_ms"]
    r["speedup_vs_grouped_mm_gemms"] = r["grouped_mm_gemms_ms"] / r["ours_ms"]
    r["speedup_vs_grouped_mm_full"] = r["grouped_mm_full_ms"] / r["ours_ms"]
    r["atomic_vs_deterministic"] = r["ours_atomic_ms"] / r["ours_ms"]
    r["breakdown_us"] = dict(ours=kernel_breakdown(ours_det), ours_atomic=kernel_breakdown(ours_atomic),
                             grouped_mm_gemms=kernel_breakdown(grouped.gemms))
    print(json.dumps(dict(label=label, routing=kind, **{k: v for k, v in r.items() if k != "breakdown_us"})),
          flush=True)
    return r



def profile_once(mh, dev) -> None:
    """The default MoE, 3 calls, first shape, balanced routing: a target for ``ncu -k regex:_w13 -c 1``."""

    label, tokens, heads = SHAPES[0]
    x, w_gate, w_up, w_down, gate, bias = moe_problem(tokens, heads, dev, torch.Generator(device=dev).manual_seed(1234))
    w13 = moe.pack_w13(w_gate, w_up)
    csr = csr_for("balanced", x, gate, bias, heads, tokens, dev, mh)
    for _ in range(3):
        moe.moe_experts(x, *csr, w13, w_down)
    torch.cuda.synchronize()
    print("profiled", label, "balanced", current_platform().describe(), flush=True)


def run_sweep(results, x, csr, w13, w_down, smoke) -> tuple[GemmConfig, GemmConfig]:
    """W13 then W2 configs on the first shape's balanced routing, whole MoE (default path) timed."""

    sweep = []
    w2_now = current_platform().w2
    w13_list = [GemmConfig(16, 32, 32, 4, 1, 1), GemmConfig(16, 32, 64, 4, 1, 2)] if smoke else W13_SWEEP
    w2_list = [GemmConfig(16, 32, 32, 4, 1), GemmConfig(32, 64, 32, 4, 1)] if smoke else W2_SWEEP
    best13 = min(w13_list, key=lambda c: _record(sweep, "w13", c, lambda: bench(
        lambda: moe.moe_experts(x, *csr, w13, w_down, w13_config=c, w2_config=w2_now), smoke, 100)))
    best2 = min(w2_list, key=lambda c: _record(sweep, "w2", c, lambda: bench(
        lambda: moe.moe_experts(x, *csr, w13, w_down, w13_config=best13, w2_config=c), smoke, 100)))
    results["sweep"] = dict(routing="balanced", shape=SHAPES[0][0], platform=current_platform().describe(),
                            candidates=sweep)
    results["chosen"] = {"w13": best13.as_dict(), "w2": best2.as_dict()}
    print("sweep chosen", results["chosen"], flush=True)
    return best13, best2


def run_variants(results, x, csr, w13, w_down, smoke) -> None:
    """Each change of issue 15 switched on in turn (balanced routing, first shape), with per-kernel µs."""

    out = []
    for name, (platform, configs) in variant_platforms().items():
        def call(platform=platform, configs=configs):
            return moe.moe_experts(x, *csr, w13, w_down, platform=platform, w13_config=configs.get("w13"),
                                   w2_config=configs.get("w2"))
        try:
            entry = dict(variant=name, ms=bench(call, smoke), breakdown_us=kernel_breakdown(call),
                         platform=platform.describe(), configs={k: v.as_dict() for k, v in configs.items()})
        except Exception as exc:  # noqa: BLE001 - a variant that does not compile is data
            entry = dict(variant=name, ms=float("inf"), error=f"{type(exc).__name__}: {exc}"[:300])
        out.append(entry)
        print(json.dumps(entry), flush=True)
    results["variants"] = out


def _record(sweep: list, which: str, config: GemmConfig, timed) -> float:
    """Time one sweep candidate; a config that fails to compile or run scores inf."""

    try:
        ms, error = timed(), None
    except Exception as exc:  # noqa: BLE001 - a failing candidate is data, not a crash
        ms, error = float("inf"), f"{type(exc).__name__}: {exc}"[:300]
    sweep.append(dict(kernel=which, ms=ms, error=error, **config.as_dict()))
    print(f"sweep {which} {config.as_dict()} {ms:.4f} ms {error or ''}", flush=True)
    return ms


def copy_ceiling(dev: str, smoke: bool) -> float:
    """Bytes per ms that one device-to-device copy reaches on this card, measured in this run: the
    memory-bound kernels' floors divide by it (a fixed H200 figure overstated an H100's ratios by ~1.3x)."""

    nbytes = (64 if smoke else 1024) << 20
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    return 2 * nbytes / bench(lambda: dst.copy_(src), smoke)


def sinkhorn_inputs(dev, gen, tokens):
    """The Sinkhorn's arguments as the model passes them (strided views of one fused [T, 24] tensor),
    the keyword settings, and its fp64 reference."""

    fused = torch.randn(tokens, 24, device=dev, generator=gen) * 3
    params = (torch.rand(1, device=dev, generator=gen) + 0.5, torch.randn(4, device=dev, generator=gen),
              torch.rand(1, device=dev, generator=gen) + 0.5, torch.randn(4, 4, device=dev, generator=gen))
    args = (fused[:, 4:8], fused[:, 8:].view(-1, 4, 4), *params)
    ref = mhc.reference_post_residual(*(t.double() for t in args), scale=0.01, iterations=20, epsilon=1e-12,
                                      out_dtype=torch.float64)
    return fused, params, args, dict(scale=0.01, iterations=20, epsilon=1e-12, out_dtype=DTYPE), ref


def projection_weights(dev, gen, tokens, hidden):
    """The projection's RMS weight per modality (3), sorted modalities and phi."""

    weight = torch.randn(3, 4 * hidden, device=dev, generator=gen) * 0.1
    modality = torch.sort(torch.randint(0, 3, (tokens,), device=dev, generator=gen)).values
    phi = torch.randn(4 * hidden, 24, device=dev, generator=gen) / (4 * hidden) ** 0.5
    return weight, modality, phi


def run_mhc(mhc_up, dev, smoke, results, checks):
    ceiling = results["copy_bytes_per_ms"]
    gen = torch.Generator(device=dev).manual_seed(99)
    hidden = 64 if smoke else 3072
    tokens_list = [37] if smoke else [15015, 4_000_000]
    native = mhc_up.MHCPostResidual.forward_native
    upstream_fused = object.__new__(mhc_up.MHCPostResidual)
    for tokens in tokens_list:
        fused, params, args, kw, ref = sinkhorn_inputs(dev, gen, tokens)
        ours = mhc.post_residual(*args, **kw)
        checks.append(dict(check=f"sinkhorn_T{tokens}", post_rel_err=rel(ours[0], ref[0]),
                           residual_rel_err=rel(ours[1], ref[1])))
        bytes_floor = tokens * (20 * 4 + 20 * 2)
        ms = bench(lambda: mhc.post_residual(*args, **kw), smoke)
        row = dict(kernel="sinkhorn", tokens=tokens, ours_ms=ms, native_ms=bench(lambda: native(*args, **kw), smoke),
                   upstream_triton_ms=bench(lambda: upstream_fused.forward_cuda(*args, **kw), smoke)
                   if torch.cuda.is_available() else None,
                   ours_graph_ms=bench_graph(lambda: mhc.post_residual(*args, **kw), smoke),
                   native_graph_ms=bench_graph(lambda: native(*args, **kw), smoke),
                   upstream_triton_graph_ms=bench_graph(lambda: upstream_fused.forward_cuda(*args, **kw), smoke),
                   ours_launches=count_launches(lambda: mhc.post_residual(*args, **kw)),
                   native_launches=count_launches(lambda: native(*args, **kw)),
                   bytes_floor=bytes_floor, floor_ms=bytes_floor / ceiling, ours_vs_floor=ms / (bytes_floor / ceiling))
        if row["ours_graph_ms"] is not None:
            row["ours_graph_vs_floor"] = row["ours_graph_ms"] / row["floor_ms"]
        results["mhc"].append(row)
        print(json.dumps(row), flush=True)
    tokens = 37 if smoke else 15015
    streams = torch.randn(tokens, 4, hidden, device=dev, generator=gen).to(DTYPE)
    branch = torch.randn(tokens, hidden, device=dev, generator=gen).to(DTYPE)
    post, residual = mhc.post_residual(fused[:tokens, 4:8], fused[:tokens, 8:].view(-1, 4, 4), *params,
                                       scale=0.01, iterations=20, epsilon=1e-12, out_dtype=DTYPE)
    ref = mhc.reference_mix(streams.double(), branch.double(), post.double(), residual.double())
    checks.append(dict(check="mhc_mix", rel_err=rel(mhc.mix(streams, branch, post, residual), ref),
                       native_rel_err=rel(mhc_up.MHCMix.forward_native(streams, branch, post, residual), ref)))
    mix_bytes = tokens * hidden * 2 * (4 + 1 + 4)
    ms = bench(lambda: mhc.mix(streams, branch, post, residual), smoke)
    results["mhc"].append(dict(kernel="mix", tokens=tokens, ours_ms=ms,
                               native_ms=bench(lambda: mhc_up.MHCMix.forward_native(streams, branch, post, residual),
                                               smoke),
                               bytes_floor=mix_bytes, ours_vs_floor=ms / (mix_bytes / ceiling)))
    alpha, bias, logits = params[0], params[1], fused[:tokens, :4]
    ref = mhc.reference_apply_pre(streams.double(), alpha.double(), bias.double(), logits.double(), scale=0.01,
                                  out_dtype=torch.float64)
    checks.append(dict(check="mhc_pre", rel_err=rel(mhc.apply_pre(streams, alpha, bias, logits, scale=0.01,
                                                                  out_dtype=DTYPE), ref)))

    def native_pre():
        coefficients = torch.sigmoid(alpha * 0.01 * logits + bias.unsqueeze(0))
        return torch.einsum("tn,tnc->tc", coefficients.to(streams.dtype), streams)

    pre_bytes = tokens * hidden * 2 * (4 + 1)
    ms = bench(lambda: mhc.apply_pre(streams, alpha, bias, logits, scale=0.01, out_dtype=DTYPE), smoke)
    results["mhc"].append(dict(kernel="pre", tokens=tokens, ours_ms=ms, native_ms=bench(native_pre, smoke),
                               bytes_floor=pre_bytes, ours_vs_floor=ms / (pre_bytes / ceiling)))
    flat = streams.view(tokens, -1)
    weight, modality, phi = projection_weights(dev, gen, tokens, hidden)

    def native_logits():
        x = flat.float()
        x = x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + 1e-6)
        return (x * (weight[modality] + 1.0)) @ phi

    ref = mhc.reference_logits(flat.double(), weight.double(), modality, 1e-6, phi.double())
    checks.append(dict(check="mhc_projection", rel_err=rel(mhc.logits(flat, weight, modality, 1e-6, phi), ref),
                       native_rel_err=rel(native_logits(), ref)))
    proj_bytes = tokens * 4 * hidden * 2
    ms = bench(lambda: mhc.logits(flat, weight, modality, 1e-6, phi), smoke)
    row = dict(kernel="projection", tokens=tokens, ours_ms=ms, native_ms=bench(native_logits, smoke),
               bytes_floor=proj_bytes, ours_vs_floor=ms / (proj_bytes / ceiling))
    if flat.dtype == torch.bfloat16:  # a candidate (not the product's path): bf16 x against phi as three bf16 terms
        split = [mhc.logits(flat, weight, modality, 1e-6, phi, bf16_split=True) for _ in range(5)]
        checks.append(dict(check="candidate_mhc_projection_bf16_split", rel_err=rel(split[0], ref),
                           deterministic_bit_identical=all(torch.equal(split[0], other) for other in split[1:])))
        row["ours_bf16_split_ms"] = bench(lambda: mhc.logits(flat, weight, modality, 1e-6, phi, bf16_split=True),
                                          smoke)
        row["ours_bf16_split_vs_floor"] = row["ours_bf16_split_ms"] / (proj_bytes / ceiling)
    results["mhc"].append(row)
    for row in results["mhc"][-3:]:
        print(json.dumps(row), flush=True)


# --mhc-sweep: launch settings of the two mHC kernels furthest from their floors (issue 31), each timed and
# checked against fp64 and for bit-identity run to run; the defaults are set from what it finds.
SINKHORN_SWEEP = [dict(block_t=b, num_warps=w, fast_reciprocal=f)
                  for f in (True, False) for b, w in ((64, 2), (128, 4), (256, 4), (256, 8), (512, 8), (512, 4))]
PROJECTION_SWEEP = (
    [dict(split=split, block_t=t, block_k=k, num_warps=w, num_stages=st)
     for split, configs in (
         ("none", ((64, 64, 4, 3), (128, 64, 8, 3), (64, 128, 4, 3), (64, 32, 4, 3))),
         ("tf32", ((64, 64, 4, 3), (128, 64, 8, 3), (64, 128, 4, 3), (128, 128, 8, 3), (64, 64, 4, 4),
                   (128, 64, 4, 3), (32, 64, 4, 3))),
         ("bf16", ((64, 64, 4, 3), (64, 64, 4, 1), (128, 64, 8, 1), (64, 64, 4, 2))))
     for t, k, w, st in configs])


def run_mhc_sweep(dev, smoke, results):
    """Every candidate's time, error against fp64 and whether five calls give the same bits."""

    from magi2_kernels import mhc_triton

    ceiling = results["copy_bytes_per_ms"]
    gen = torch.Generator(device=dev).manual_seed(99)
    tokens = 37 if smoke else 4_000_000
    _, _, args, kw, ref = sinkhorn_inputs(dev, gen, tokens)
    floor_ms = tokens * (20 * 4 + 20 * 2) / ceiling
    rows = results.setdefault("mhc_sweep", [])
    for config in SINKHORN_SWEEP[:2] if smoke else SINKHORN_SWEEP:
        if smoke:
            config = dict(config, fast_reciprocal=False)  # inline PTX: not under the interpreter
        try:
            runs = [mhc_triton.post_residual(*args, **kw, **config) for _ in range(5)]
            row = dict(kernel="sinkhorn", tokens=tokens, **config,
                       ms=bench(lambda: mhc_triton.post_residual(*args, **kw, **config), smoke),
                       post_rel_err=rel(runs[0][0], ref[0]), residual_rel_err=rel(runs[0][1], ref[1]),
                       bit_identical=all(torch.equal(runs[0][1], r[1]) and torch.equal(runs[0][0], r[0])
                                         for r in runs[1:]))
            row["vs_floor"] = row["ms"] / floor_ms
        except Exception as error:  # noqa: BLE001 - a config that does not compile is a row, not the end
            row = dict(kernel="sinkhorn", tokens=tokens, **config, error=repr(error)[:300])
        rows.append(row)
        print(json.dumps(row), flush=True)
    tokens, hidden = (37, 64) if smoke else (15015, 3072)
    flat = torch.randn(tokens, 4 * hidden, device=dev, generator=gen).to(DTYPE)
    weight, modality, phi = projection_weights(dev, gen, tokens, hidden)
    ref = mhc.reference_logits(flat.double(), weight.double(), modality, 1e-6, phi.double())
    floor_ms = tokens * 4 * hidden * 2 / ceiling
    precision = current_platform().dot_precision
    for config in PROJECTION_SWEEP[::6] if smoke else PROJECTION_SWEEP:
        if smoke:
            config = dict(config, block_k=16, block_t=16)
        try:
            def call(config=config):
                launch = {k: v for k, v in config.items() if k != "split"}
                return mhc_triton.logits(flat, weight, modality, 1e-6, phi, num_streams=4, dot_precision=precision,
                                         bf16_split=config["split"] == "bf16", tf32_split=config["split"] == "tf32",
                                         **launch)
            runs = [call() for _ in range(5)]
            row = dict(kernel="projection", tokens=tokens, **config, ms=bench(call, smoke),
                       rel_err=rel(runs[0], ref), bit_identical=all(torch.equal(runs[0], r) for r in runs[1:]))
            row["vs_floor"] = row["ms"] / floor_ms
        except Exception as error:  # noqa: BLE001
            row = dict(kernel="projection", tokens=tokens, **config, error=repr(error)[:300])
        rows.append(row)
        print(json.dumps(row), flush=True)


def run_sink(dev, smoke, results, checks):
    gen = torch.Generator(device=dev).manual_seed(7)
    tokens, heads, dim = (29, 4, 32) if smoke else (30030, 24, 128)
    out = torch.randn(tokens, heads, dim, device=dev, generator=gen).to(DTYPE)
    lse = torch.randn(heads, tokens, device=dev, generator=gen) * 3
    sink = torch.randn(1, heads, device=dev, generator=gen)
    gates = torch.randn(tokens, heads, 1, device=dev, generator=gen).to(DTYPE)
    rows = torch.randperm(tokens, device=dev, generator=gen)

    def native():
        old = lse.float().transpose(0, 1)
        new = torch.logaddexp(old, torch.logsumexp(sink.float(), dim=0).unsqueeze(0))
        delta = old - new
        delta = torch.where(torch.isfinite(delta), delta, torch.full_like(delta, -torch.inf))
        corrected = out * torch.exp(delta).unsqueeze(-1).to(out.dtype)
        return (corrected.index_select(0, rows) * torch.sigmoid(gates)).to(DTYPE)

    def ours():
        return attention_sink.sink_gate(out, lse, sink, gates, rows, out_dtype=DTYPE)

    ref = attention_sink.reference_sink_gate(out.double(), lse.double(), sink.double(), gates.double(), rows)
    checks.append(dict(check="attention_sink_gate", rel_err=rel(ours(), ref), native_rel_err=rel(native(), ref)))
    nbytes = tokens * heads * dim * 2 * 2
    ms = bench(ours, smoke)
    results["attention_sink"].append(dict(tokens=tokens, heads=heads, dim=dim, ours_ms=ms,
                                          native_ms=bench(native, smoke), ours_graph_ms=bench_graph(ours, smoke),
                                          native_graph_ms=bench_graph(native, smoke),
                                          ours_launches=count_launches(ours), native_launches=count_launches(native),
                                          bytes_floor=nbytes, ours_vs_floor=ms * results['copy_bytes_per_ms'] / nbytes))
    print(json.dumps(results["attention_sink"][-1]), flush=True)


# Pass bounds of the full-shape checks (||out - ref|| / ||ref||, or equalities); any miss fails the run.
CHECK_BOUNDS = {"rel_err": 1e-2, "ours_det_rel_err": 1e-2, "ours_atomic_rel_err": 1e-2, "upstream_rel_err": 1e-2,
                "grouped_mm_full_rel_err": 1e-2, "post_rel_err": 1e-2, "residual_rel_err": 1e-2,
                "native_rel_err": 1e-2, "probs_rel_err": 1e-6}
PROJECTION_BOUND = 1e-5


def judge(check: dict) -> dict:
    """Adds ``passed`` (every bound of CHECK_BOUNDS met, every equality true) to one check."""

    failed = [k for k, v in check.items() if isinstance(v, bool) and not v]
    for key, value in check.items():
        projection = check["check"] in ("mhc_projection", "candidate_mhc_projection_bf16_split")
        bound = PROJECTION_BOUND if projection and key == "rel_err" else CHECK_BOUNDS.get(key)
        if bound is not None and not value <= bound:
            failed.append(key)
    check["passed"] = not failed
    if failed:
        check["failed"] = failed
    return check


def card_slug(device_name: str) -> str:
    """The card's short name for the output file: "NVIDIA H100 80GB HBM3" -> "h100", "cpu" -> "cpu".

    Round 2 wrote an H100 run as kernels-h200-<date>.json; the name now comes from the card itself.
    """

    model = re.search(r"\b([A-Za-z]{1,3}\d{2,4}[A-Za-z]?)\b", device_name.replace("NVIDIA", ""))
    text = model.group(1) if model else device_name
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def device_name(dev: str) -> str:
    """The card the bench runs on, as the driver names it ("NVIDIA H100 80GB HBM3"), or "cpu"."""

    return torch.cuda.get_device_name() if dev == "cuda" else "cpu"


def stamp_rows(results: dict) -> None:
    """Every row says which card measured it, so a table copied out of the JSON still names it: each list of rows
    (MoE shapes, mHC, sink, variants, checks) and the sweep's candidates."""

    sections = [rows for rows in results.values() if isinstance(rows, list)]
    sections.append(results.get("sweep", {}).get("candidates", []))
    for rows in sections:
        for row in rows:
            if isinstance(row, dict):
                row["device"] = results["device"]


def default_out_dir() -> str:
    """Outside the checkout: bench output is copied into docs/perf/ by hand, never written there."""

    return os.path.join(os.environ.get("TMPDIR", "/tmp"), "magi2-bench-kernels")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream-site", required=True, help="folder holding the unpacked vllm_omni package")
    parser.add_argument("--out", default=default_out_dir(),
                        help="folder for kernels-<device>-<date>.json (default: %(default)s, outside the checkout)")
    parser.add_argument("--sweep", action="store_true", help="sweep the MoE GEMM configs on the first shape")
    parser.add_argument("--mhc-sweep", action="store_true",
                        help="also time the Sinkhorn's and the mHC projection's launch settings (time, error, bits)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, to check the script itself")
    parser.add_argument("--profile", action="store_true",
                        help="only run the default MoE 3 times on the first shape's balanced routing (for ncu)")
    parser.add_argument("--only", default="moe,mhc,sink,mhc-sweep",
                        help="comma-separated sections to run (default: all; mhc-sweep also needs --mhc-sweep)")
    args = parser.parse_args()
    only = set(args.only.split(","))
    if not only or only - {"moe", "mhc", "sink", "mhc-sweep"}:
        parser.error(f"--only: {args.only!r}; name sections from moe, mhc, sink, mhc-sweep, e.g. --only mhc,sink")
    if not os.path.isfile(os.path.join(args.upstream_site, "vllm_omni", "diffusion", "models", "magi2", "mh_moe.py")):
        parser.error(f"--upstream-site: {args.upstream_site} holds no vllm_omni/diffusion/models/magi2/mh_moe.py. "
                     "Fix: unpack vllm_omni-0.30.0-py3-none-any.whl there (docs/kernels.md, 'How to run')")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    smoke = args.smoke or dev == "cpu"
    mh, mhc_up = load_upstream(args.upstream_site)
    if os.environ.get("TRITON_INTERPRET") == "1":
        # The interpreter cannot read tl.constexpr module globals inside upstream's jit function.
        mh._SWIGLU7_ALPHA, mh._SWIGLU7_LIMIT, mh._SWIGLU7_BIAS = 1.702, 7.0, 1.0
    date = datetime.date.today().isoformat()
    results = dict(date=date, device=device_name(dev),
                   command=" ".join([os.path.basename(sys.executable), *sys.argv]),
                   versions=dict(torch=torch.__version__, triton=triton.__version__, vllm_omni="0.30.0",
                                 python=sys.version.split()[0]),
                   platform=current_platform().describe(), rows=[], mhc=[], attention_sink=[], checks=[])
    checks = results["checks"]
    results["copy_bytes_per_ms"] = copy_ceiling(dev, smoke)
    global E, TOP_K, D_HEAD, D_EXPERT, DTYPE
    if smoke:
        E, TOP_K, D_HEAD, D_EXPERT, DTYPE = 8, 2, 64, 128, torch.float16
    os.makedirs(args.out, exist_ok=True)
    card = card_slug(results["device"])
    out = os.path.join(args.out, f"kernels-{card}-smoke-{date}.json" if smoke else f"kernels-{card}-{date}.json")

    def save() -> None:
        """Write what is measured so far (temp file, then rename): a run cut off keeps its rows."""

        stamp_rows(results)
        with tempfile.NamedTemporaryFile("w", dir=args.out, suffix=".tmp", delete=False) as handle:
            json.dump(results, handle, indent=1)
        os.replace(handle.name, out)

    if args.profile:
        profile_once(mh, dev)
        return
    sections = {"moe": lambda: run_moe(args, mh, dev, smoke, results, checks, save),
                "mhc": lambda: run_mhc(mhc_up, dev, smoke, results, checks),
                "sink": lambda: run_sink(dev, smoke, results, checks),
                "mhc-sweep": lambda: run_mhc_sweep(dev, smoke, results)}
    for name, section in sections.items():
        if name not in only or (name == "mhc-sweep" and not args.mhc_sweep):
            continue
        try:
            section()
        except Exception:  # noqa: BLE001 - keep the other sections' numbers; the error is recorded
            results.setdefault("errors", []).append(traceback.format_exc())
            traceback.print_exc()
    for check in checks:
        judge(check)
    if len(results["rows"]) >= 3:
        small, large = results["rows"][0]["routing"], results["rows"][2]["routing"]
        results["growth_272p_to_540p"] = {
            kind: dict(tokens_ratio=results["rows"][2]["tokens"] / results["rows"][0]["tokens"],
                       ours_time_ratio=large[kind]["ours_ms"] / small[kind]["ours_ms"],
                       upstream_time_ratio=large[kind]["upstream_ms"] / small[kind]["upstream_ms"])
            for kind in ROUTINGS if kind in small and kind in large}
    failed = [c["check"] for c in checks if not c["passed"] and not c["check"].startswith("candidate_")]
    results["passed"] = not failed and not results.get("errors")
    save()
    print("\nchecks:")
    for check in checks:
        print(" ", json.dumps(check))
    print(f"\n{'shape':16} {'routing':9} {'ours':>7} {'atomic':>7} {'vllm-omni':>9} {'gmm gemms':>9} {'gmm full':>8} "
          f"{'dense':>6} {'TF/s':>5} {'x dense':>7} {'x up':>5} {'x gmm':>5} {'used':>5}")
    for row in results["rows"]:
        for kind, r in row["routing"].items():
            print(f"{row['label']:16} {kind:9} {r['ours_ms']:7.3f} {r['ours_atomic_ms']:7.3f} {r['upstream_ms']:9.3f} "
                  f"{r['grouped_mm_gemms_ms']:9.3f} {r['grouped_mm_full_ms']:8.3f} {row['dense_ms']:6.3f} "
                  f"{r['ours_tflops']:5.0f} {r['ours_vs_dense_speed']:7.2f} {r['speedup_vs_upstream']:5.2f} "
                  f"{r['speedup_vs_grouped_mm_gemms']:5.2f} {r['stats']['experts_used']:5d}")
    for r in results["mhc"] + results["attention_sink"]:
        print(" ", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})
    print("wrote", out)
    if not results["passed"]:
        print(f"FAILED: checks {failed}, section errors {len(results.get('errors', []))}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
