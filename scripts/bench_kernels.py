"""Side-by-side benchmark and full-shape correctness of magi2_kernels vs vLLM-Omni 0.30.0's kernels.

Runs upstream (its ``mh_moe.py`` / ``layers/mhc.py`` loaded from the unpacked vllm-omni wheel with
``vllm.triton_utils``, ``vllm.logger``, ``vllm_omni.platforms`` and ``CustomOp`` stubbed, as
``../shared/baselines/bench_upstream_mh_moe.py`` does) and ours in one process on the same inputs.
Prints a table and writes JSON (rows: label, tokens, heads, upstream_ms, ours_ms, dense_ms,
ours_tflops, ...; plus device, versions, date).

    python scripts/bench_kernels.py --upstream-site /tmp/vllm_omni_wheel [--sweep] [--out FILE]

``--smoke`` runs everything at tiny shapes (CPU: set TRITON_INTERPRET=1) to check the script.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import logging
import os
import sys
import time
import traceback
import types

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
    # block_k < 256: flattened (n-block, k-step) loop; block_k == 256: x tile resident.
    GemmConfig(128, 128, 64, 8, 3, 10), GemmConfig(128, 128, 64, 8, 4, 5), GemmConfig(128, 128, 128, 8, 2, 5),
    GemmConfig(64, 64, 64, 4, 4, 5), GemmConfig(128, 64, 128, 8, 3, 10),
    GemmConfig(128, 64, 256, 8, 2, 20), GemmConfig(128, 64, 256, 8, 3, 20), GemmConfig(128, 64, 256, 8, 2, 10),
    GemmConfig(64, 64, 256, 4, 2, 20), GemmConfig(64, 128, 256, 4, 2, 10), GemmConfig(128, 128, 256, 8, 1, 10),
    GemmConfig(128, 32, 256, 4, 3, 40), GemmConfig(256, 64, 64, 8, 3, 10), GemmConfig(128, 64, 64, 4, 3, 10),
    GemmConfig(128, 64, 256, 4, 2, 10), GemmConfig(128, 128, 64, 8, 2, 5),
]
ROUTING_SWEEP = [(16, 4), (32, 4), (32, 8), (64, 8), (64, 16)]  # (block_t, num_warps) of the top-k kernel
W2_SWEEP = [
    GemmConfig(128, 256, 64, 8, 3), GemmConfig(128, 128, 64, 8, 4), GemmConfig(128, 128, 64, 4, 4),
    GemmConfig(64, 256, 64, 4, 3), GemmConfig(128, 256, 32, 8, 4), GemmConfig(128, 128, 128, 8, 3),
    GemmConfig(64, 128, 64, 4, 4), GemmConfig(256, 128, 64, 8, 3), GemmConfig(128, 256, 64, 8, 4),
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


def moe_problem(tokens: int, heads: int, dev: str, gen: torch.Generator):
    x = torch.randn(tokens, heads, D_HEAD, device=dev, generator=gen).to(DTYPE)
    w_gate = (torch.randn(heads * E, D_HEAD, D_EXPERT, device=dev, generator=gen) / 16).to(DTYPE)
    w_up = (torch.randn(heads * E, D_HEAD, D_EXPERT, device=dev, generator=gen) / 16).to(DTYPE)
    w_down = (torch.randn(heads * E, D_EXPERT, D_HEAD, device=dev, generator=gen) / 36).to(DTYPE)
    gate = torch.randn(heads, E, D_HEAD, device=dev, generator=gen)
    bias = torch.randn(heads, E, device=dev, generator=gen) * 0.01
    return x, w_gate, w_up, w_down, gate, bias


def run_moe(args, mh, dev, smoke, results, checks):
    gen = torch.Generator(device=dev).manual_seed(1234)
    shapes = SMOKE_SHAPES if smoke else SHAPES
    w13_cfg, w2_cfg = current_platform().w13, current_platform().w2
    for index, (label, tokens, heads) in enumerate(shapes):
        x, w_gate, w_up, w_down, gate, bias = moe_problem(tokens, heads, dev, gen)
        w13 = moe.pack_w13(w_gate, w_up)

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
        slots = routing.slots_from_csr(up_ids, up_offsets, heads, tokens, TOP_K)
        csr = (up_ids, up_probs, up_offsets, slots)

        if args.sweep and index == 0:
            sweep = []
            w13_list = [GemmConfig(16, 32, 32, 4, 1, 1), GemmConfig(16, 32, 32, 4, 1, 2)] if smoke else W13_SWEEP
            w2_list = [GemmConfig(16, 32, 32, 4, 1), GemmConfig(32, 64, 32, 4, 1)] if smoke else W2_SWEEP
            best13 = min(
                w13_list,
                key=lambda c: _record(sweep, "w13", c, lambda: bench(
                    lambda: moe.moe_experts(x, *csr, w13, w_down, w13_config=c, w2_config=w2_cfg), smoke, 100)),
            )
            best2 = min(
                w2_list,
                key=lambda c: _record(sweep, "w2", c, lambda: bench(
                    lambda: moe.moe_experts(x, *csr, w13, w_down, w13_config=best13, w2_config=c), smoke, 100)),
            )
            w13_cfg, w2_cfg = best13, best2
            from magi2_kernels import routing_triton

            for block_t, warps in ([(16, 4)] if smoke else ROUTING_SWEEP):
                # Times the top-k launch alone; route() uses routing_triton.topk's defaults.
                ms = bench(lambda: routing_triton.topk(x, gate, bias, TOP_K, route_norm=True, route_scale=1.0,
                                                       norm_eps=1e-12, dot_precision=current_platform().dot_precision,
                                                       block_t=block_t, num_warps=warps), smoke, 100)
                sweep.append(dict(kernel="routing_topk", ms=ms, block_t=block_t, num_warps=warps))
                print(f"sweep routing_topk block_t={block_t} warps={warps} {ms:.4f} ms", flush=True)
            results["sweep"] = sweep
            results["chosen"] = {"w13": best13.as_dict(), "w2": best2.as_dict()}
            print("sweep chosen", results["chosen"], flush=True)

        def ours_atomic():
            return moe.moe_experts(x, *csr, w13, w_down, w13_config=w13_cfg, w2_config=w2_cfg)

        def ours_det():
            return moe.moe_experts(x, *csr, w13, w_down, deterministic=True, w13_config=w13_cfg, w2_config=w2_cfg)

        def upstream_atomic():
            return mh.triton_mh_moe_forward(x, up_ids, up_probs, up_offsets, w_gate, w_up, w_down)

        def upstream_det():
            return mh.triton_mh_moe_forward(x, up_ids, up_probs, up_offsets, w_gate, w_up, w_down, deterministic=True)

        # Correctness at full shape: fp32 reference (bf16 operands upcast), both variants, twice.
        ref = moe.reference_moe(x, up_ids, up_probs, up_offsets, w13, w_down, compute_dtype=torch.float32).float()
        out_a, out_d, out_d2 = ours_atomic(), ours_det(), ours_det()
        checks.append(dict(check=f"moe_{label}", ours_atomic_rel_err=rel(out_a, ref), ours_det_rel_err=rel(out_d, ref),
                           upstream_rel_err=rel(upstream_atomic(), ref),
                           deterministic_bit_identical=bool(torch.equal(out_d, out_d2)),
                           ours_routing_end_to_end_rel_err=rel(
                               moe.moe_experts(x, ours.gather_ids, ours.probs, ours.offsets, ours.slots, w13, w_down,
                                               w13_config=w13_cfg, w2_config=w2_cfg), ref)))
        del ref, out_a, out_d, out_d2
        routes = tokens * heads * TOP_K
        flops = moe.moe_flops(routes, D_HEAD, D_EXPERT)
        a = torch.randn(routes, D_HEAD, device=dev, dtype=DTYPE)
        b = torch.randn(D_HEAD, 2 * D_EXPERT, device=dev, dtype=DTYPE)
        c = torch.randn(routes, D_EXPERT, device=dev, dtype=DTYPE)
        d = torch.randn(D_EXPERT, D_HEAD, device=dev, dtype=DTYPE)
        row = dict(label=label, tokens=tokens, heads=heads, routes=routes, gflop=flops / 1e9,
                   upstream_ms=bench(upstream_atomic, smoke), ours_ms=bench(ours_atomic, smoke),
                   upstream_deterministic_ms=bench(upstream_det, smoke), ours_deterministic_ms=bench(ours_det, smoke),
                   dense_ms=bench(lambda: (a @ b, c @ d), smoke),
                   upstream_routing_ms=bench(upstream_routing, smoke), ours_routing_ms=bench(our_routing, smoke),
                   ours_routing_graph_ms=bench_graph(our_routing, smoke),
                   ours_routing_launches=count_launches(our_routing),
                   upstream_routing_launches=count_launches(upstream_routing),
                   w13_config=w13_cfg.as_dict(), w2_config=w2_cfg.as_dict())
        if index == 0:
            row["breakdown_us"] = dict(ours_atomic=kernel_breakdown(ours_atomic), ours_det=kernel_breakdown(ours_det),
                                       ours_routing=kernel_breakdown(our_routing),
                                       upstream_atomic=kernel_breakdown(upstream_atomic))
        row["ours_tflops"] = flops / row["ours_ms"] / 1e9
        row["upstream_tflops"] = flops / row["upstream_ms"] / 1e9
        row["dense_tflops"] = flops / row["dense_ms"] / 1e9
        row["ours_vs_dense"] = row["dense_ms"] / row["ours_ms"]
        row["deterministic_vs_atomic"] = row["ours_deterministic_ms"] / row["ours_ms"]
        results["rows"].append(row)
        print(json.dumps(row), flush=True)
        del x, w_gate, w_up, w_down, w13, a, b, c, d
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _record(sweep: list, which: str, config: GemmConfig, timed) -> float:
    """Time one sweep candidate; a config that fails to compile or run scores inf."""

    try:
        ms, error = timed(), None
    except Exception as exc:  # noqa: BLE001 - a failing candidate is data, not a crash
        ms, error = float("inf"), f"{type(exc).__name__}: {exc}"[:300]
    sweep.append(dict(kernel=which, ms=ms, error=error, **config.as_dict()))
    print(f"sweep {which} {config.as_dict()} {ms:.4f} ms {error or ''}", flush=True)
    return ms


def run_mhc(mhc_up, dev, smoke, results, checks):
    gen = torch.Generator(device=dev).manual_seed(99)
    hidden = 64 if smoke else 3072
    tokens_list = [37] if smoke else [15015, 4_000_000]
    native = mhc_up.MHCPostResidual.forward_native
    upstream_fused = object.__new__(mhc_up.MHCPostResidual)
    for tokens in tokens_list:
        fused = torch.randn(tokens, 24, device=dev, generator=gen) * 3
        params = (torch.rand(1, device=dev, generator=gen) + 0.5, torch.randn(4, device=dev, generator=gen),
                  torch.rand(1, device=dev, generator=gen) + 0.5, torch.randn(4, 4, device=dev, generator=gen))
        args = (fused[:, 4:8], fused[:, 8:].view(-1, 4, 4), *params)
        kw = dict(scale=0.01, iterations=20, epsilon=1e-12, out_dtype=DTYPE)
        ours = mhc.post_residual(*args, **kw)
        ref = mhc.reference_post_residual(*(t.double() for t in args), scale=0.01, iterations=20, epsilon=1e-12,
                                          out_dtype=torch.float64)
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
                   bytes_floor=bytes_floor, floor_ms=bytes_floor / 4.24e9, ours_vs_floor=ms / (bytes_floor / 4.24e9))
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
                               bytes_floor=mix_bytes, ours_vs_floor=ms / (mix_bytes / 4.24e9)))
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
                               bytes_floor=pre_bytes, ours_vs_floor=ms / (pre_bytes / 4.24e9)))
    flat = streams.view(tokens, -1)
    weight = torch.randn(3, 4 * hidden, device=dev, generator=gen) * 0.1
    modality = torch.sort(torch.randint(0, 3, (tokens,), device=dev, generator=gen)).values
    phi = torch.randn(4 * hidden, 24, device=dev, generator=gen) / (4 * hidden) ** 0.5

    def native_logits():
        x = flat.float()
        x = x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + 1e-6)
        return (x * (weight[modality] + 1.0)) @ phi

    ref = mhc.reference_logits(flat.double(), weight.double(), modality, 1e-6, phi.double())
    checks.append(dict(check="mhc_projection", rel_err=rel(mhc.logits(flat, weight, modality, 1e-6, phi), ref),
                       native_rel_err=rel(native_logits(), ref)))
    proj_bytes = tokens * 4 * hidden * 2
    ms = bench(lambda: mhc.logits(flat, weight, modality, 1e-6, phi), smoke)
    results["mhc"].append(dict(kernel="projection", tokens=tokens, ours_ms=ms, native_ms=bench(native_logits, smoke),
                               bytes_floor=proj_bytes, ours_vs_floor=ms / (proj_bytes / 4.24e9)))
    for row in results["mhc"][-3:]:
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
    results["attention_sink"].append(dict(tokens=tokens, heads=heads, dim=dim, ours_ms=ms, native_ms=bench(native, smoke),
                                          ours_graph_ms=bench_graph(ours, smoke), native_graph_ms=bench_graph(native, smoke),
                                          ours_launches=count_launches(ours), native_launches=count_launches(native),
                                          bytes_floor=nbytes, ours_vs_floor=ms / (nbytes / 4.24e9)))
    print(json.dumps(results["attention_sink"][-1]), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream-site", required=True, help="folder holding the unpacked vllm_omni package")
    parser.add_argument("--out", default=None, help="JSON path (default docs/perf/kernels-h200-<date>.json)")
    parser.add_argument("--sweep", action="store_true", help="sweep the MoE GEMM configs on the first shape")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, to check the script itself")
    args = parser.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    smoke = args.smoke or dev == "cpu"
    mh, mhc_up = load_upstream(args.upstream_site)
    if os.environ.get("TRITON_INTERPRET") == "1":
        # The interpreter cannot read tl.constexpr module globals inside upstream's jit function.
        mh._SWIGLU7_ALPHA, mh._SWIGLU7_LIMIT, mh._SWIGLU7_BIAS = 1.702, 7.0, 1.0
    date = datetime.date.today().isoformat()
    results = dict(date=date, device=torch.cuda.get_device_name() if dev == "cuda" else "cpu",
                   versions=dict(torch=torch.__version__, triton=triton.__version__, vllm_omni="0.30.0",
                                 python=sys.version.split()[0]),
                   platform=current_platform().describe(), rows=[], mhc=[], attention_sink=[], checks=[])
    checks = results["checks"]
    global E, TOP_K, D_HEAD, D_EXPERT, DTYPE
    if smoke:
        E, TOP_K, D_HEAD, D_EXPERT, DTYPE = 8, 2, 64, 128, torch.float16
    for section in (lambda: run_moe(args, mh, dev, smoke, results, checks),
                    lambda: run_mhc(mhc_up, dev, smoke, results, checks),
                    lambda: run_sink(dev, smoke, results, checks)):
        try:
            section()
        except Exception:  # noqa: BLE001 - keep the other sections' numbers; the error is recorded
            results.setdefault("errors", []).append(traceback.format_exc())
            traceback.print_exc()
    if len(results["rows"]) >= 3:
        small, large = results["rows"][0], results["rows"][2]
        results["growth_272p_to_540p"] = dict(tokens_ratio=large["tokens"] / small["tokens"],
                                              ours_time_ratio=large["ours_ms"] / small["ours_ms"],
                                              upstream_time_ratio=large["upstream_ms"] / small["upstream_ms"])
    out = args.out or os.path.join("docs", "perf", f"kernels-h200-{date}.json")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as handle:
        json.dump(results, handle, indent=1)
    print("\nchecks:")
    for check in checks:
        print(" ", json.dumps(check))
    print(f"\n{'label':18} {'tokens':>7} {'heads':>5} {'upstream_ms':>11} {'ours_ms':>8} {'dense_ms':>8} "
          f"{'ours_TF/s':>9} {'det/atomic':>10} {'route_up':>8} {'route_ours':>10}")
    for r in results["rows"]:
        if "ours_ms" not in r:
            continue
        print(f"{r['label']:18} {r['tokens']:7d} {r['heads']:5d} {r['upstream_ms']:11.3f} {r['ours_ms']:8.3f} "
              f"{r['dense_ms']:8.3f} {r['ours_tflops']:9.1f} {r['deterministic_vs_atomic']:10.3f} "
              f"{r['upstream_routing_ms']:8.3f} {r['ours_routing_ms']:10.3f}")
    for r in results["mhc"] + results["attention_sink"]:
        print(" ", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})
    print("wrote", out)


if __name__ == "__main__":
    main()
