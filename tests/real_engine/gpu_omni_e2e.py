"""GPU check of the real path: the test checkpoint, upstream's DiT at real width, and ``Omni`` end to end.

Run on a CUDA machine with vLLM-Omni importable (scripts/device-omni-carry prepares the lent GPU):
``python3 tests/real_engine/gpu_omni_e2e.py STAGE OUT_DIR --ckpt ROOT``. Each stage writes
``OUT_DIR/<stage>.json`` and keeps going past a failed part, recording the error:

- ``checkpoint``: ``scripts/make-test-checkpoint`` (real widths, reduced depth, seeded, drawn on the GPU),
  then ``magi2studio weights check`` on it for 272p and 540p, with every file's sha256 compared.
- ``layers``: upstream's ``Magi2PreviewTransformer`` at the test depth, loaded by its strict loader from
  that tree, sampled by upstream's ``Magi2PreviewSampler`` at 272p and 540p shapes (kernels off, then
  ours): ms per DiT layer per step (CUDA events around each layer), the split between the attention
  kernel, attention projections, MoE, dense MLP and mHC, peak memory.
- ``supervision``: a worker stopped (SIGSTOP), then one killed (SIGKILL) mid-run; the watchdog's reports,
  and the next request on the same engine object.
- ``server``: ``vllm-omni serve … --omni`` started with the command ``serve_command`` prints, then
  ``magi2studio generate --engine vllm-omni-server`` (T2VA twice, I2VA), a job cancelled after its first
  step (our DELETE, upstream's ``abort_request``; steps after it are timed), and a plain request again.
- ``e2e``: ``magi2studio``'s vllm-omni engine (``Omni`` in a supervised child, the plugin in its
  diffusion worker) on ``sp1-cfg1-offload``: T2VA twice (deterministic: hashes must match), I2VA,
  540p, and T2VA with kernels off; each a complete run folder.

vLLM's compiled FlashAttention is not on the device; ``device_shims`` (a ``vllm.general_plugins`` entry
point only the carry installs) puts torch's FlashAttention-2 varlen kernel in its place, and every
JSON says so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROMPT = (REPO / "magi2studio" / "data" / "sandai" / "assets" / "sample_000.txt").read_text(encoding="utf-8")
IMAGE = REPO / "magi2studio" / "data" / "sandai" / "assets" / "sample_000.jpeg"
SUBSTITUTION = ("vllm.vllm_flash_attn (compiled, not carried) -> torch aten._flash_attention_forward (FA2); "
                "vllm._C_stable_libtorch (compiled custom ops, not carried) -> tests/real_engine/vllm_ops_stand_in.py "
                "(capability queries answer 'not supported'); vllm_flash_attn._vllm_fa2_C -> an empty module")


def versions() -> dict:
    import platform
    from importlib.metadata import version

    import torch
    import triton

    out = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
           "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0),
           "driver_capability": list(torch.cuda.get_device_capability(0))}
    for name in ("vllm", "vllm-omni", "transformers", "diffusers", "av"):
        try:
            out[name] = version(name)
        except Exception as err:  # noqa: BLE001 - recorded, not fatal
            out[name] = f"missing: {err}"
    return out


def attempt(results: dict, name: str, func, *args, **kwargs):
    """Run one part; record its result or its error and keep going."""

    started = time.perf_counter()
    try:
        value = func(*args, **kwargs)
        results[name] = {"ok": True, "s": round(time.perf_counter() - started, 2), "result": value}
        return value
    except BaseException as err:  # noqa: BLE001 - a device check records every failure
        results[name] = {"ok": False, "s": round(time.perf_counter() - started, 2),
                         "error": f"{type(err).__name__}: {err}"[:4000], "traceback": traceback.format_exc()[-6000:]}
        print(f"[{name}] FAILED: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        if isinstance(err, KeyboardInterrupt):  # the call's time limit (timeout -s INT): stop, keep what was recorded
            raise
        return None


# ---- checkpoint ---------------------------------------------------------------------------------


def stage_checkpoint(ckpt: Path, results: dict) -> None:
    import subprocess

    def make() -> dict:
        if (ckpt / "SHA256SUMS").is_file():
            return {"reused": True}
        command = [sys.executable, str(REPO / "scripts" / "make-test-checkpoint"), str(ckpt), "--device", "cuda"]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(done.stderr[-3000:])
        return {"stdout": done.stdout[-2000:]}

    attempt(results, "make_test_checkpoint", make)

    def sizes() -> dict:
        total = {}
        for path in sorted(ckpt.rglob("*")):
            if path.is_file():
                top = path.relative_to(ckpt).parts[0]
                total[top] = total.get(top, 0) + path.stat().st_size
        return {k: round(v / 2**30, 3) for k, v in total.items()}

    attempt(results, "tree_gib", sizes)
    from magi2studio.engines.test_checkpoint import sums_digest
    from magi2studio.weights import check_weights

    for tier in ("272p", "540p"):
        attempt(results, f"weights_check_{tier}",
                lambda tier=tier: check_weights(ckpt, tier, hash_files=tier == "272p").as_dict())
    attempt(results, "sha256sums_digest", sums_digest, ckpt)


# ---- layers -------------------------------------------------------------------------------------


CATEGORIES = {
    "attention_kernel": ("attention", ("attend",)),
    "attention_proj": ("attention", ("project", "output")),
    "moe_route_combine": ("mlp", ("route_input", "combine")),
    "mhc": ("mhc_handler", ("compute_logits", "apply_pre", "compute_post_residual", "hyper_connect")),
}


class LayerClock:
    """CUDA events around every layer call and around the parts of each layer, read after the loop."""

    def __init__(self, model) -> None:
        self.model = model
        self.events: list[tuple[int, str, object, object]] = []
        self.wrapped: list[tuple[object, str]] = []
        self.handles = []

    def _timed(self, layer: int, category: str, func):
        import torch

        def timed(*args, **kwargs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = func(*args, **kwargs)
            end.record()
            self.events.append((layer, category, start, end))
            return out

        return timed

    def install(self) -> None:
        from vllm_omni.diffusion.models.magi2.modeling_magi2 import Magi2MultiHeadMoELayer

        for index, layer in enumerate(self.model.block.layers):
            layer_forward = layer.forward
            layer.forward = self._timed(index, "layer", layer_forward)
            self.wrapped.append((layer, "forward"))
            for category, (child, names) in CATEGORIES.items():
                owner = getattr(layer, child)
                for name in names:
                    if hasattr(owner, name):
                        setattr(owner, name, self._timed(index, category, getattr(owner, name)))
                        self.wrapped.append((owner, name))
            if isinstance(layer.mlp, Magi2MultiHeadMoELayer):
                target, category = layer.mlp.moe_mlp, "moe_experts"
            else:
                target, category = layer.mlp, "dense_mlp"
            target.forward = self._timed(index, category, target.forward)
            self.wrapped.append((target, "forward"))

    def remove(self) -> None:
        for owner, name in self.wrapped:
            owner.__dict__.pop(name, None)
        self.wrapped.clear()

    def read(self, steps: int) -> dict:
        import torch

        torch.cuda.synchronize()
        per_layer: dict[int, dict[str, float]] = {}
        calls: dict[int, int] = {}
        for layer, category, start, end in self.events:
            bucket = per_layer.setdefault(layer, {})
            bucket[category] = bucket.get(category, 0.0) + start.elapsed_time(end)
            if category == "layer":
                calls[layer] = calls.get(layer, 0) + 1
        self.events.clear()
        rows = []
        for layer, bucket in sorted(per_layer.items()):
            total = bucket.pop("layer")
            parts = {k: round(v / steps, 3) for k, v in bucket.items()}
            parts["rest"] = round((total - sum(bucket.values())) / steps, 3)
            rows.append({"layer": layer, "ms_per_step": round(total / steps, 3),
                         "forwards_per_step": calls[layer] / steps, "split_ms_per_step": parts})
        return {"layers": rows}


def real_sampler_input(tier: str, steps: int, text_tokens: int = 512):
    import torch
    from vllm_omni.diffusion.models.magi2.configuration_magi2 import MAGI2_GENERATION_CONFIG as gen
    from vllm_omni.diffusion.models.magi2.sampler_magi2 import CFGConfig, SamplerInput, build_magi2_preview_schedulers

    width, height = {"272p": (448, 256), "540p": (896, 512)}[tier]
    frames = int(round(gen.duration_seconds * gen.fps)) * 2
    latent_t = (frames - 1) // gen.video_vae_stride[0] + 1
    g = torch.Generator(device="cuda").manual_seed(7)
    video, audio = build_magi2_preview_schedulers(steps, device="cuda", shift=gen.shift)
    stride = gen.video_vae_stride
    shape = (1, gen.video_latent_channels, latent_t, height // stride[1], width // stride[2])
    audio_len = int(round(gen.duration_seconds * gen.audio_latent_fps))
    return SamplerInput(
        video_t_list=video.timesteps, audio_t_list=audio.timesteps,
        latent=torch.randn(shape, generator=g, device="cuda"),
        audio_latent=torch.randn(1, audio_len, gen.audio_latent_channels, generator=g, device="cuda"),
        txt_feat=torch.randn(1, text_tokens, 5120, generator=g, device="cuda").to(torch.bfloat16),
        null_txt_feat=torch.randn(1, text_tokens, 5120, generator=g, device="cuda").to(torch.bfloat16),
        ref_audio_feat=torch.zeros(1, 0, gen.audio_latent_channels, device="cuda"), ref_video_feat=None,
        video_scheduler=video, audio_scheduler=audio,
        cfg_config=CFGConfig(video_txt_guidance_scale=gen.video_guidance_scale,
                             audio_txt_guidance_scale=gen.audio_guidance_scale),
    ), list(shape)


def stage_layers(ckpt: Path, results: dict, steps: int) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    import device_shims

    results["flash_attention_substitute_rel_error"] = device_shims.self_check()
    device_shims.register()
    from magi2studio import plugin
    from magi2studio.engines import test_checkpoint
    from magi2studio.engines.embedded import upstream_patches

    os.environ[test_checkpoint.ENV_TEST_CHECKPOINT] = str(ckpt)
    os.environ.pop("MAGI2_KERNELS", None)
    state = plugin.register()  # applies the test depth, installs the step hooks; kernels off
    results["test_checkpoint_applied"] = state["test_checkpoint"]["spec"]
    torch.cuda.set_device(0)
    upstream_patches.init_parallel(world_size=1, rank=0, port=upstream_patches.free_port(), ulysses_degree=1,
                                   cfg_parallel_size=1, backend="nccl")
    from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator
    from vllm_omni.diffusion.models.magi2 import configuration_magi2
    from vllm_omni.diffusion.models.magi2.modeling_magi2 import Magi2PreviewTransformer
    from vllm_omni.diffusion.models.magi2.preview_data_proxy import Magi2DataProxy
    from vllm_omni.diffusion.models.magi2.sampler_magi2 import Magi2PreviewSampler

    started = time.perf_counter()
    with torch.device("cuda"):
        model = Magi2PreviewTransformer(configuration_magi2.MAGI2_PREVIEW_CONFIG)
    shards = sorted(str(p) for p in (ckpt / "preview").glob("*.safetensors"))
    loaded = model.load_weights(safetensors_weights_iterator(shards, use_tqdm_on_load=False))
    model.eval()
    results["dit_load"] = {"s": round(time.perf_counter() - started, 2), "tensors": len(loaded),
                           "gib": round(torch.cuda.memory_allocated() / 2**30, 2)}
    sampler = Magi2PreviewSampler(model, Magi2DataProxy(), device="cuda", dtype=torch.bfloat16)
    clock = LayerClock(model)
    for kernels in ("off", "on"):
        if kernels == "on":
            os.environ["MAGI2_KERNELS"] = "on"
            results["kernels_installed"] = plugin.install_kernel_overrides()
        for tier in ("272p", "540p"):
            def run(tier=tier) -> dict:
                with torch.inference_mode():
                    warm, _ = real_sampler_input(tier, 1)
                    sampler.sample(warm)
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    sample_input, shape = real_sampler_input(tier, steps)
                    clock.install()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    latent, audio = sampler.sample(sample_input)
                    end.record()
                    clock.remove()
                    layers = clock.read(steps)
                    finite = bool(torch.isfinite(latent).all() and torch.isfinite(audio).all())
                return {"latent_shape": shape, "steps": steps, "ms_per_step": round(start.elapsed_time(end) / steps, 2),
                        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2), "finite": finite, **layers}

            attempt(results, f"sample_{tier}_kernels_{kernels}", run)


# ---- e2e ----------------------------------------------------------------------------------------


def stage_e2e(ckpt: Path, work: Path, results: dict, steps: int, runs_asked: list[str]) -> None:
    import importlib.util

    from magi2studio.vocabulary.layouts import parse_layout

    layout = parse_layout("sp1-cfg1-offload")
    outputs = work / "runs"
    outputs.mkdir(parents=True, exist_ok=True)
    plans = {
        "t2va_272p_a": ("on", dict(tier="272p")),
        "t2va_272p_b": ("on", dict(tier="272p")),
        "i2va_272p": ("on", dict(tier="272p", mode="i2va", image=str(IMAGE))),
        "t2va_540p": ("on", dict(tier="540p")),
        "t2va_272p_kernels_off": ("off", dict(tier="272p")),
    }
    engines: dict[str, object] = {}
    have_av = importlib.util.find_spec("av") is not None
    try:
        run_each(runs_asked, plans, engines, have_av, ckpt, work, outputs, layout, steps, results)
    finally:
        for engine in engines.values():
            engine.close()
    a, b = results.get("t2va_272p_a", {}), results.get("t2va_272p_b", {})
    if a.get("ok") and b.get("ok"):
        results["deterministic_twice_identical"] = (a["result"]["hashes"]["frames_sha256"], a["result"]["hashes"][
            "pcm_sha256"]) == (b["result"]["hashes"]["frames_sha256"], b["result"]["hashes"]["pcm_sha256"])


def run_each(runs_asked, plans, engines, have_av, ckpt, work, outputs, layout, steps, results) -> None:
    """One engine per kernel selection (``MAGI2_KERNELS`` is the workers' env), each run recorded."""

    from magi2studio import media
    from magi2studio.run_folder import runs
    from magi2studio.engines import get_engine
    from magi2studio.vocabulary.request import build_request

    for name in runs_asked:
        kernels, fields = plans[name]

        def one(kernels=kernels, fields=fields) -> dict:
            if kernels not in engines:
                for other in engines.values():
                    other.close()
                engines.clear()
                os.environ["MAGI2_KERNELS"] = kernels
                engines[kernels] = get_engine("vllm-omni", checkpoint_root=str(ckpt),
                                              work_dir=str(work / f"engine-{kernels}"), start_timeout_s=540)
            request = build_request(prompt=PROMPT, seed=1234, steps=steps, compile="eager", deterministic=True,
                                    **fields)
            engine = engines[kernels]
            if have_av:
                folder = runs.execute(engine, request, layout, outputs)
                manifest = folder.manifest
                return {"folder": folder.path.name, "files": sorted(p.name for p in folder.path.iterdir()),
                        "hashes": manifest["hashes"], "timing": manifest.get("timing"), "engine": manifest["engine"],
                        "versions": manifest.get("versions")}
            # No PyAV carried in this call: the same plan and generation, hashed as write_run hashes them.
            plan = engine.plan(request, layout)
            engine.start(plan.layout)
            generation = engine.generate(plan)
            return {"run_folder": "not written (PyAV not carried in this call)",
                    "hashes": {"frames_sha256": media.frames_sha256(generation.frames),
                               "pcm_sha256": media.pcm_sha256(generation.audio)},
                    "frames_shape": list(generation.frames.shape), "audio_shape": list(generation.audio.shape),
                    "stage_ms": generation.stage_ms, "step_records": generation.step_records,
                    "engine": generation.engine_info}

        attempt(results, name, one)


# ---- supervision ---------------------------------------------------------------------------------


def worker_pids(engine) -> list[int]:
    """The processes under the engine's supervised child (vLLM-Omni's workers), or the child if it has none."""

    import psutil

    child = engine._process._process.pid  # noqa: SLF001 - the check looks at the real process tree
    return [p.pid for p in psutil.Process(child).children(recursive=True)] or [child]


def stage_supervision(ckpt: Path, work: Path, results: dict, steps: int) -> None:
    """A worker stopped (SIGSTOP), then one killed (SIGKILL) mid-run; then a plain run on the same engine object.

    The step watchdog ($MAGI2STUDIO_STEP_TIMEOUT_S, 30 s here) must report the stopped worker and kill the
    process group; the killed one must be reported; each next request starts a fresh engine and the last one
    completes with the hashes of the e2e stage's identical request (kernels on, deterministic).
    """

    import signal
    import threading

    import psutil

    from magi2studio import media
    from magi2studio.engines import get_engine
    from magi2studio.vocabulary.layouts import parse_layout
    from magi2studio.vocabulary.request import build_request

    os.environ["MAGI2STUDIO_STEP_TIMEOUT_S"] = "30"
    os.environ["MAGI2_KERNELS"] = "on"
    engine = get_engine("vllm-omni", checkpoint_root=str(ckpt), work_dir=str(work / "engine-supervision"),
                        start_timeout_s=300)
    layout = parse_layout("sp1-cfg1-offload")
    request = build_request(prompt=PROMPT, seed=1234, steps=steps, compile="eager", deterministic=True, tier="272p")
    try:
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            def disturbed(sig=sig) -> dict:
                plan = engine.plan(request, layout)
                engine.start(plan.layout)
                first_step = threading.Event()
                sent: dict = {}

                def on_progress(progress) -> None:
                    if getattr(progress, "step", None) is not None and progress.step >= 1:
                        first_step.set()

                def disturb() -> None:
                    first_step.wait(600)
                    sent["pids"] = worker_pids(engine)
                    sent["at"] = time.perf_counter()
                    for pid in sent["pids"]:
                        os.kill(pid, sig)

                thread = threading.Thread(target=disturb, daemon=True)
                thread.start()
                try:
                    engine.generate(plan, on_progress=on_progress)
                    outcome = "completed (not reported)"
                except Exception as err:  # noqa: BLE001 - the report is what is checked
                    outcome = f"{type(err).__name__}: {str(err).splitlines()[0]}"
                reported_after = round(time.perf_counter() - sent.get("at", time.perf_counter()), 1)
                time.sleep(2)
                left = [pid for pid in sent.get("pids", []) if psutil.pid_exists(pid)
                        and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
                return {"signal": sig.name, "workers_signalled": len(sent.get("pids", [])), "report": outcome,
                        "reported_s_after_signal": reported_after, "workers_left_alive": left}

            attempt(results, f"worker_{sig.name}", disturbed)

        def next_request() -> dict:
            plan = engine.plan(request, layout)
            engine.start(plan.layout)
            generation = engine.generate(plan)
            return {"frames_sha256": media.frames_sha256(generation.frames),
                    "pcm_sha256": media.pcm_sha256(generation.audio), "stage_ms": generation.stage_ms}

        attempt(results, "next_request_after_both", next_request)
    finally:
        engine.close()


# ---- server ---------------------------------------------------------------------------------------


SERVER_PORT = 8011


def start_server(ckpt: Path, work: Path, metrics: Path):
    """``vllm-omni serve`` exactly as ``serve_command`` prints it (the carry has no console script, so the
    program is vLLM-Omni's CLI module), with our kernels on; its log in ``work/server.log``."""

    import shlex
    import subprocess

    from magi2studio.engines.vllm_omni.server_client import serve_command
    from magi2studio.vocabulary.layouts import parse_layout
    from magi2studio.vocabulary.tiers import TIERS

    command = serve_command(parse_layout("sp1-cfg1-offload"), TIERS["272p"], model=str(ckpt), port=SERVER_PORT,
                            compile_mode="eager", deterministic=True, metrics_dir=str(metrics))
    words = shlex.split(command)
    program = words.index("vllm-omni")
    env = {**os.environ, **dict(w.split("=", 1) for w in words[:program]), "MAGI2_KERNELS": "on",
           "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "vllm_omni.entrypoints.cli.main", *words[program + 1:]]
    log = open(work / "server.log", "wb")  # noqa: SIM115 - the server outlives this function
    process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return command, process


def wait_healthy(process, timeout_s: float) -> float:
    import httpx

    began = time.perf_counter()
    while time.perf_counter() - began < timeout_s:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before it was healthy")
        try:
            if httpx.get(f"http://127.0.0.1:{SERVER_PORT}/health", timeout=2).status_code == 200:
                return round(time.perf_counter() - began, 1)
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"the server was not healthy within {timeout_s:.0f} s")


def cli_generate(work: Path, metrics: Path, ckpt: Path, steps: int, *extra: str) -> dict:
    """``magi2studio generate --engine vllm-omni-server`` in its own process, as a user runs it."""

    import subprocess

    argv = [sys.executable, "-c", "import sys; from magi2studio.cli import main; sys.exit(main())", "generate",
            "--engine", "vllm-omni-server", "--server-url", f"http://127.0.0.1:{SERVER_PORT}",
            "--server-metrics-dir", str(metrics), "--server-compile", "eager", "--layout", "sp1-cfg1-offload",
            "--prompt", PROMPT, "--seed", "1234", "--steps", str(steps), "--tier", "272p",
            "--out", str(work / "server-runs"), *extra]
    began = time.perf_counter()
    done = subprocess.run(argv, env={**os.environ, "MAGI2_CKPT_ROOT": str(ckpt)}, capture_output=True, text=True,
                          timeout=400)
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}: {done.stderr.strip()[-1500:]}")
    folder = Path(next(line.split(": ", 1)[1] for line in done.stdout.splitlines() if line.startswith("run folder:")))
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    return {"s": round(time.perf_counter() - began, 1), "folder": folder.name,
            "files": sorted(p.name for p in folder.iterdir()), "hashes": manifest["hashes"],
            "steps_recorded": manifest["timing"]["stages"].get("preview", {}).get("steps", 0),
            "stages": manifest.get("timing", {}).get("stages"), "engine": manifest["engine"]}


def cancel_mid_run(ckpt: Path, metrics: Path, steps: int) -> dict:
    """A job cancelled after its first step: our client's DELETE, upstream's abort_request; the progress lines
    (rank 0 writes one per finished step) are timed here to see whether the denoising loop stopped."""

    from magi2studio.engines import get_engine
    from magi2studio.errors import Cancelled
    from magi2studio.vocabulary.layouts import parse_layout
    from magi2studio.vocabulary.request import build_request

    import threading

    engine = get_engine("vllm-omni-server", server_url=f"http://127.0.0.1:{SERVER_PORT}", metrics_dir=str(metrics),
                        server_compile="eager", checkpoint_root=str(ckpt), poll_interval_s=0.2)
    progress_file = metrics / "progress.jsonl"
    seen: list[tuple[float, int]] = []
    cancel = threading.Event()
    stop_watch = threading.Event()
    began = time.perf_counter()
    start_offset = progress_file.stat().st_size if progress_file.exists() else 0

    def watch() -> None:
        offset = start_offset
        while not stop_watch.is_set():
            if progress_file.exists():
                with open(progress_file, encoding="utf-8") as file:
                    file.seek(offset)
                    chunk = file.read()
                    offset = file.tell()
                for line in chunk.splitlines():
                    seen.append((time.perf_counter() - began, json.loads(line)["step"]))
                    if not cancel.is_set():
                        cancel.set()
            stop_watch.wait(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    request = build_request(prompt=PROMPT, seed=1234, steps=steps, compile="eager", deterministic=True, tier="272p")
    plan = engine.plan(request, parse_layout("sp1-cfg1-offload"))
    engine.start(plan.layout)
    outcome = "completed (the cancel did not stop it)"
    try:
        engine.generate(plan, cancel=cancel)
    except Cancelled as err:
        outcome = f"Cancelled: {err}"
    ended = time.perf_counter() - began
    time.sleep(8)  # steps the server still runs after the DELETE show up here
    stop_watch.set()
    watcher.join()
    engine.close()
    cancel_at = seen[0][0] if seen else None
    after = [(round(t - cancel_at, 2), step) for t, step in seen if cancel_at is not None and t > cancel_at]
    return {"steps_asked": steps, "outcome": outcome, "cancel_set_s": round(cancel_at, 2) if cancel_at else None,
            "client_returned_s": round(ended, 2), "progress_lines_after_cancel": after,
            "last_step_index": seen[-1][1] if seen else None}


def stage_server(ckpt: Path, work: Path, results: dict, steps: int) -> None:
    """``vllm-omni serve … --omni`` from ``serve_command``; ``magi2studio generate --engine vllm-omni-server``
    T2VA twice and I2VA; one job cancelled after its first step; then a plain request again."""

    import signal

    work.mkdir(parents=True, exist_ok=True)
    metrics = work / "server-metrics"
    metrics.mkdir(exist_ok=True)
    command, process = start_server(ckpt, work, metrics)
    results["serve_command"] = command
    try:
        if attempt(results, "server_healthy_after_s", wait_healthy, process, 420) is None:
            return
        attempt(results, "t2va_a", cli_generate, work, metrics, ckpt, steps)
        attempt(results, "t2va_b", cli_generate, work, metrics, ckpt, steps)
        attempt(results, "i2va", cli_generate, work, metrics, ckpt, steps, "--image", str(IMAGE))
        attempt(results, "cancel", cancel_mid_run, ckpt, metrics, 40)
        attempt(results, "t2va_after_cancel", cli_generate, work, metrics, ckpt, steps)
        a, b = results.get("t2va_a", {}), results.get("t2va_b", {})
        if a.get("ok") and b.get("ok"):
            results["deterministic_twice_identical"] = a["result"]["hashes"] == b["result"]["hashes"]
        after = results.get("t2va_after_cancel", {})
        if a.get("ok") and after.get("ok"):
            results["after_cancel_identical"] = a["result"]["hashes"] == after["result"]["hashes"]
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, sig)
                process.wait(30)
                break
            except ProcessLookupError:  # it had exited (the log says why)
                break
            except Exception:  # noqa: BLE001 - SIGTERM not heeded in 30 s: SIGKILL
                continue
        log = (work / "server.log").read_text(encoding="utf-8", errors="replace")
        results["server_log_abort_lines"] = [line[-400:] for line in log.splitlines()
                                             if "abort" in line.lower() or "cancel" in line.lower()][-30:]
        results["server_log_tail"] = log[-6000:]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("stage", choices=("checkpoint", "layers", "e2e", "supervision", "server"))
    parser.add_argument("out")
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--work", default=None, help="e2e: engines' work folders and run folders (default OUT)")
    parser.add_argument("--runs", default="t2va_272p_a,t2va_272p_b,i2va_272p,t2va_540p,t2va_272p_kernels_off")
    args = parser.parse_args()
    out, ckpt = Path(args.out), Path(args.ckpt)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"stage": args.stage, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                     "flash_attention": SUBSTITUTION}
    attempt(results, "versions", versions)
    try:
        if args.stage == "checkpoint":
            stage_checkpoint(ckpt, results)
        elif args.stage == "layers":
            attempt(results, "layers_stage", stage_layers, ckpt, results, args.steps)
        elif args.stage == "server":
            stage_server(ckpt, Path(args.work or out), results, args.steps)
        elif args.stage == "supervision":
            stage_supervision(ckpt, Path(args.work or out), results, args.steps)
        else:
            stage_e2e(ckpt, Path(args.work or out), results, args.steps, args.runs.split(","))
    finally:
        (out / f"{args.stage}.json").write_text(json.dumps(results, indent=1, default=str), encoding="utf-8")
    failed = [k for k, v in results.items() if isinstance(v, dict) and v.get("ok") is False]
    print(json.dumps({"stage": args.stage, "failed": failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
