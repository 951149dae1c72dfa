#!/usr/bin/env python3
"""Fit the live preview's linear latent -> RGB map to a tiny checkpoint's own video decoder, on the CPU.

    .venv/bin/python scripts/fit_preview_map.py --weights trained --out magi2studio/data/preview/tiny-trained.json
    .venv/bin/python scripts/fit_preview_map.py --weights random --out magi2studio/data/preview/tiny-random.json

Latents: the tiny model's latent codes of seeded scenes (``training.latents.encode_frames``: what
the tiny DiT learns to produce), ``--train`` scenes of the train split to fit on and ``--held-out``
scenes of the held-out split to judge on. Each is decoded by the checkpoint's TurboVAE decoder
(upstream's ``Magi2TurboVAEDecoder``); latent frame ``k`` ends at decoded frame ``2^u k`` for
``u`` time-doubling up blocks (``training.latents``), and each latent cell's decoded pixels, area-pooled to
``--patch``, are the cell's target. One least-squares fit; the file records the seed, the counts
and the held-out PSNR of the map against the true decode (the test's floor is set from it).

The real MAGI-2's 48-channel Wan2.2 latent needs real decoded frames: this script has no real VAE
here and fits none (docs/studio.md, "Live preview").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def cell_targets(decoded, latent_frames: int, patch: int, stride: int, time_upsamplings: int = 1):
    """Decoded ``[3, F, H, W]`` in [-1, 1] -> per latent cell ``[T * h * w, 3 * patch * patch]``."""

    import torch

    frames = decoded[:, ::2 ** time_upsamplings][:, :latent_frames]  # latent frame k ends at decoded frame 2^u k
    pooled = torch.nn.functional.avg_pool3d(frames.unsqueeze(0), (1, stride // patch, stride // patch))[0]
    colours, count, height, width = pooled.shape
    cells = pooled.reshape(colours, count, height // patch, patch, width // patch, patch)
    return cells.permute(1, 2, 4, 0, 3, 5).reshape(-1, colours * patch * patch)


def latents_and_targets(components, scenes, patch: int):
    import numpy as np
    import torch

    from magi2studio.engines.embedded.checkpoint import turbo_config
    from magi2studio.training.latents import encode_scene

    config = components.config
    stride = turbo_config(config)["spatial_compression_ratio"]  # decoded pixels per latent cell
    xs, ys, latents, decodes = [], [], [], []
    for scene in scenes:
        latent = encode_scene(scene, config.spatial_stride, config.latent_frames)[0]  # [48, T, h, w]
        with torch.inference_mode():
            decoded = components.video_decoder.decode(latent.unsqueeze(0).float())[0].float()
        xs.append(latent.permute(1, 2, 3, 0).reshape(-1, latent.shape[0]).numpy())
        ys.append(cell_targets(decoded, config.latent_frames, patch, stride, config.turbo_time_upsamplings).numpy())
        latents.append(latent)
        decodes.append(decoded)
    return np.concatenate(xs), np.concatenate(ys), latents, decodes


def psnr(estimate, truth) -> float:
    """PSNR of two pictures in [-1, 1] (peak 2)."""

    import numpy as np

    error = float(np.mean((np.clip(estimate, -1, 1) - np.clip(truth, -1, 1)) ** 2))
    return float(10 * np.log10(4.0 / max(error, 1e-12)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--weights", default="trained", help="random, trained, or a tiny checkpoint folder")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--train", type=int, default=24, help="scenes to fit on")
    parser.add_argument("--held-out", type=int, default=8, help="held-out scenes to judge on")
    parser.add_argument("--patch", type=int, default=8, help="RGB patch per latent cell (the decoder's 8, or less)")
    args = parser.parse_args(argv)

    import itertools

    import numpy as np

    from magi2studio.engines import get_engine
    from magi2studio.engines.embedded.components import load_components
    from magi2studio.engines.live_preview import LinearPreviewMap, decoder_digest, fit_linear_map
    from magi2studio.semantic.scenes import sample_scenes

    # The engine's own folder: the weights' folder, or the tree it generates (its cache), made as it makes it.
    root = get_engine("embedded", weights=args.weights).checkpoint()
    components = load_components(root)
    train = list(itertools.islice(sample_scenes(args.seed, split="train"), args.train))
    held = list(itertools.islice(sample_scenes(args.seed + 1, split="held_out"), args.held_out))
    x, y, _, _ = latents_and_targets(components, train, args.patch)
    weight, bias = fit_linear_map(x, y, args.patch)
    hx, hy, _, _ = latents_and_targets(components, held, args.patch)
    held_psnr = psnr(hx @ weight + bias, hy)
    mean_psnr = psnr(np.broadcast_to(y.mean(axis=0), hy.shape), hy)  # the floor a constant picture gets
    fitted = LinearPreviewMap(
        name=f"tiny-{args.weights if args.weights in ('random', 'trained') else Path(args.weights).name}",
        decoder_sha256=decoder_digest(root / "turbo_vae"), weight=weight, bias=bias, patch=args.patch,
        fit={"script": "scripts/fit_preview_map.py", "weights": args.weights, "seed": args.seed,
             "train_scenes": args.train, "held_out_scenes": args.held_out, "cells": int(len(x)),
             "held_out_psnr_db": round(held_psnr, 2), "constant_picture_psnr_db": round(mean_psnr, 2)})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fitted.write(args.out)
    print(f"{args.out}: held-out PSNR {held_psnr:.2f} dB (a constant picture: {mean_psnr:.2f} dB), "
          f"{len(x)} cells, decoder {fitted.decoder_sha256[:12]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
