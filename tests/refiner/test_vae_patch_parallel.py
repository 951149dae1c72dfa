"""1080p decode under VAE patch-parallel = world size: upstream's TurboVAE tile executor over gloo ranks."""

import pytest
import torch
import torch.multiprocessing as mp


def _rank(rank, port, root, results):
    from magi2studio.engines.embedded import upstream_patches
    from magi2studio.engines.embedded.components import load_components
    from magi2studio.engines.embedded.driver import EmbeddedDriver

    upstream_patches.init_parallel(world_size=2, rank=rank, port=port, ulysses_degree=2, cfg_parallel_size=1)
    try:
        driver = EmbeddedDriver(load_components(root))
        driver.set_vae_patch_parallel(2)
        latent = torch.randn(1, 48, driver.c.config.refiner_latent_frames, 17, 30,
                             generator=torch.Generator().manual_seed(5))
        with torch.inference_mode():
            frames = driver.decode_refined_video(latent, 480, 272, 249)
        results.put((rank, None if frames is None else frames.tobytes()))
    finally:
        upstream_patches.destroy_parallel()


@pytest.mark.slow
def test_patch_parallel_decode_gives_rank_0_the_single_process_clip(tmp_path):
    from magi2studio.engines.embedded import upstream_patches
    from magi2studio.engines.embedded.checkpoint import ensure_checkpoint
    from magi2studio.engines.embedded.components import load_components
    from magi2studio.engines.embedded.driver import EmbeddedDriver
    from magi2studio.engines.embedded.tiny import TinyConfig

    root = ensure_checkpoint(TinyConfig())
    context = mp.get_context("spawn")
    results = context.Queue()
    port = upstream_patches.free_port()
    procs = [context.Process(target=_rank, args=(rank, port, root, results)) for rank in range(2)]
    for proc in procs:
        proc.start()
    got = dict(results.get(timeout=300) for _ in procs)
    for proc in procs:
        proc.join(60)
    assert got[1] is None  # rank 1 decoded its tiles and handed them over
    single = EmbeddedDriver(load_components(root))  # no torch.distributed world here: one process decodes all
    latent = torch.randn(1, 48, single.c.config.refiner_latent_frames, 17, 30,
                         generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        assert got[0] == single.decode_refined_video(latent, 480, 272, 249).tobytes()
