"""Upstream's MAGI-2 sampler over a tiny, seeded ``Magi2PreviewTransformer``, on CPU (gloo).

Used by the plugin tests: the ranks are spawned processes, each joining a gloo group and
vLLM-Omni's parallel state exactly as a diffusion worker does (the recipe in
shared/notes/upstream-magi2-on-cpu.md), then calling the vllm.general_plugins entry point.
"""

from __future__ import annotations

import math
import os
import socket


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tiny_transformer(seed: int = 0):
    import torch
    from vllm_omni.diffusion.models.magi2.configuration_magi2 import Magi2MoEConfig, Magi2PreviewConfig
    from vllm_omni.diffusion.models.magi2.modeling_magi2 import Magi2PreviewTransformer

    config = Magi2PreviewConfig(
        num_layers=3, hidden_size=256, head_dim=64, num_query_groups=2, text_in_channels=128,
        multimodal_layers=(0, 2), params_dtype=torch.float32,
        moe=Magi2MoEConfig(num_heads=4, num_experts=8, top_k=2, expert_intermediate_size=64,
                           shared_expert_intermediate_size=64, modality_shared_expert_intermediate_size=64,
                           layers=(1,)),
    )
    model = Magi2PreviewTransformer(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # upstream allocates with torch.empty
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if not tensor.is_floating_point():
                continue
            if tensor.dim() >= 2:
                tensor.copy_(torch.randn(tensor.shape, generator=generator) / math.sqrt(tensor[0].numel()))
            else:
                tensor.copy_(1.0 + 0.02 * torch.randn(tensor.shape, generator=generator))
    return model.eval()


def sampler_input(steps: int, device: str = "cpu", seed: int = 1):
    import torch
    from vllm_omni.diffusion.models.magi2.sampler_magi2 import CFGConfig, SamplerInput, build_magi2_preview_schedulers

    generator = torch.Generator().manual_seed(seed)
    video, audio = build_magi2_preview_schedulers(steps, device=device)
    return SamplerInput(
        video_t_list=video.timesteps, audio_t_list=audio.timesteps,
        latent=torch.randn(1, 48, 2, 2, 4, generator=generator).to(device),
        audio_latent=torch.randn(1, 8, 64, generator=generator).to(device),
        txt_feat=torch.randn(1, 6, 128, generator=generator).to(device),
        null_txt_feat=torch.randn(1, 6, 128, generator=generator).to(device),
        ref_audio_feat=torch.zeros(1, 0, 64, device=device), ref_video_feat=None,
        video_scheduler=video, audio_scheduler=audio, cfg_config=CFGConfig(),
    )


def join_group(rank: int, world_size: int, port: int, cfg_parallel_size: int) -> None:
    """Become one rank of a gloo CFG-parallel group, as a diffusion worker would."""

    import torch.distributed as dist
    from vllm_omni.diffusion.distributed import parallel_state
    from vllm_omni.platforms.interface import UnspecifiedOmniPlatform

    UnspecifiedOmniPlatform.get_device_count = classmethod(lambda cls: 1)
    UnspecifiedOmniPlatform.set_device = classmethod(lambda cls, device: None)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    parallel_state.init_distributed_environment(world_size=world_size, rank=rank, local_rank=rank,
                                                distributed_init_method="env://", backend="gloo")
    parallel_state.initialize_model_parallel(cfg_parallel_size=cfg_parallel_size, backend="gloo")


def load_entry_point_plugin():
    """Call our vllm.general_plugins entry point the way vLLM's plugin loader does."""

    from importlib.metadata import entry_points

    (plugin,) = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "magi2studio"]
    return plugin.load()()


def run_rank(rank: int, world_size: int, port: int, cfg_parallel_size: int, steps: int, out_dir: str) -> None:
    """One spawned rank: plugin from env, then a sample; writes the final latent for comparison."""

    import torch

    os.environ["MAGI2STUDIO_METRICS_DIR"] = out_dir
    state = load_entry_point_plugin()
    assert state["timer"] is not None, state
    join_group(rank, world_size, port, cfg_parallel_size)
    from vllm_omni.diffusion.models.magi2.sampler_magi2 import Magi2PreviewSampler

    from vllm_omni.diffusion.models.magi2 import sampler_magi2

    closed_by: dict[str, int] = {}
    for name in ("step", "_step_guided"):  # count which per-step method closed each step
        hooked = getattr(Magi2PreviewSampler, name)

        def counting(*args, _hooked=hooked, _name=name, **kwargs):
            closed_by[_name] = closed_by.get(_name, 0) + 1
            return _hooked(*args, **kwargs)

        setattr(Magi2PreviewSampler, name, counting if name == "step" else staticmethod(counting))
    sampler = Magi2PreviewSampler(tiny_transformer())
    latent, audio = sampler.sample(sampler_input(steps))
    torch.save({"latent": latent, "audio": audio, "closed_by": closed_by,
                "cfg_world_size": sampler_magi2.get_classifier_free_guidance_world_size()},
               os.path.join(out_dir, f"result-rank{rank}.pt"))
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


def spawn(world_size: int, cfg_parallel_size: int, steps: int, out_dir: str) -> None:
    import torch.multiprocessing as mp

    mp.spawn(run_rank, args=(world_size, free_port(), cfg_parallel_size, steps, out_dir), nprocs=world_size)


def run_rank_aborted(rank: int, world_size: int, port: int, cfg_parallel_size: int, steps: int, out_dir: str,
                     signal_name: str, abort_at_step: int) -> None:
    """One spawned rank sampling inside upstream's cancellation scope, as its model runner enters it for a
    request; rank 0 sets the request's abort flag (what ``DiffusionEngine.abort`` writes) as step
    ``abort_at_step`` begins. Writes how many steps each rank ran and how it ended."""

    import json

    os.environ["MAGI2STUDIO_METRICS_DIR"] = out_dir
    load_entry_point_plugin()
    join_group(rank, world_size, port, cfg_parallel_size)
    from multiprocessing.shared_memory import SharedMemory

    from vllm_omni.platforms.interface import UnspecifiedOmniPlatform

    # An abort drains the device's queued work first; the CPU test platform has no device to drain.
    UnspecifiedOmniPlatform.synchronize = classmethod(lambda cls: None)

    from vllm_omni.diffusion.cancellation import request_cancellation_scope
    from vllm_omni.diffusion.models.magi2.pipeline_magi2 import Magi2Pipeline
    from vllm_omni.diffusion.models.magi2.sampler_magi2 import Magi2PreviewSampler

    ran = {"steps": 0}
    name = "_step_guided" if cfg_parallel_size > 1 else "step"
    hooked = getattr(Magi2PreviewSampler, name)

    def counting(*args, **kwargs):
        if rank == 0 and ran["steps"] == abort_at_step:
            flag = SharedMemory(name=signal_name)
            flag.buf[0] = 1
            flag.close()
        ran["steps"] += 1
        return hooked(*args, **kwargs)

    setattr(Magi2PreviewSampler, name, counting if name == "step" else staticmethod(counting))
    sampler = Magi2PreviewSampler(tiny_transformer())
    try:
        enabled = getattr(Magi2Pipeline, "supports_request_cancellation", False) is True  # as its model runner asks
        with request_cancellation_scope([signal_name], enabled=enabled):
            sampler.sample(sampler_input(steps))
        ended = "completed"
    except Exception as err:  # noqa: BLE001 - how it ended is what the test reads
        ended = type(err).__name__
    with open(os.path.join(out_dir, f"aborted-rank{rank}.json"), "w", encoding="utf-8") as file:
        json.dump({"steps": ran["steps"], "ended": ended}, file)
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


def spawn_aborted(world_size: int, cfg_parallel_size: int, steps: int, out_dir: str, signal_name: str,
                  abort_at_step: int) -> None:
    import torch.multiprocessing as mp

    mp.spawn(run_rank_aborted, args=(world_size, free_port(), cfg_parallel_size, steps, out_dir, signal_name,
                                     abort_at_step), nprocs=world_size)


def run_rank_cancel_file(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """One spawned rank whose cancel file only rank 0 finds at a step end (each looks a moment apart from the
    others; here the others never find theirs). Writes whether the step end stopped this rank."""

    import json

    from magi2studio.errors import Cancelled

    os.environ.update(MAGI2STUDIO_METRICS_DIR=out_dir, MAGI2STUDIO_CANCEL_FILE=os.path.join(out_dir, f"cancel-{rank}"))
    timer = load_entry_point_plugin()["timer"]
    join_group(rank, world_size, port, cfg_parallel_size=world_size)
    if rank == 0:
        open(os.environ["MAGI2STUDIO_CANCEL_FILE"], "w").close()
    timer.rank = rank
    try:
        timer.on_step("preview", 1, 6)
        ended = "went on"
    except Cancelled:
        ended = "Cancelled"
    with open(os.path.join(out_dir, f"cancel-file-rank{rank}.json"), "w", encoding="utf-8") as file:
        json.dump({"ended": ended}, file)
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


def spawn_cancel_file(world_size: int, out_dir: str) -> None:
    import torch.multiprocessing as mp

    mp.spawn(run_rank_cancel_file, args=(world_size, free_port(), out_dir), nprocs=world_size)
