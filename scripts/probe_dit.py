#!/usr/bin/env python3
"""Where a trained tiny DiT leaves noise: the checks to run before scoring a checkpoint (issue 28).

    .venv/bin/python scripts/probe_dit.py W/pack --out probe.json

On training scenes (``--scenes``, drawn from seed 0 as training draws them) and the conditional branch, at
fixed noise levels ``s``, through the trainer's own batch (``trainer.dit_batch``) and upstream's forward:

- the velocity MSE for video and audio, and the eigenvalues of the video error's covariance over a DiT token's
  values (2 x 2 cells x 48 channels = 192 at the 16-pixel code): many eigenvalues near 1 mean whole directions
  of the noise passed through untouched;
- the x0 estimate's error (``x_t - s v`` against the scene's code), on the object's cells and the background's;
- the product of the mHC residual mixes of all layers: its singular values (median over tokens) say how many of
  the 4 residual streams survive (1, 0, 0, 0: they collapsed into one).

docs/training.md ("The DiT's residual streams") has what these numbers meant for the runs so far.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("weights", type=Path, help="a packed tiny checkpoint folder (train_tiny.py --phase pack)")
    parser.add_argument("--levels", default="0.9,0.5,0.2,0.05", help="noise levels s, comma-separated")
    parser.add_argument("--scenes", type=int, default=6, help="training scenes probed (seed 0's first N)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, help="JSON results file (printed either way)")
    args = parser.parse_args(argv)
    try:
        levels = [float(level) for level in args.levels.split(",")]
    except ValueError:
        parser.error(f"--levels: {args.levels!r} is not a comma-separated list of numbers; e.g. 0.9,0.5,0.2")
    if not all(0.0 < level < 1.0 for level in levels):
        parser.error(f"--levels: {args.levels} has a level outside (0, 1); each s is a noise level between them")
    if args.scenes < 1:
        parser.error(f"--scenes: {args.scenes}; give 1 or more")
    if not (args.weights / "magi2studio-tiny.json").is_file():
        parser.error(f"weights: {args.weights} is not a packed tiny checkpoint (no magi2studio-tiny.json); "
                     "run scripts/train_tiny.py --phase pack --out FOLDER first")

    import torch

    from magi2studio.engines.embedded import upstream_patches
    from magi2studio.engines.embedded.components import load_components
    from magi2studio.training import latents as codes
    from magi2studio.training import trainer
    from vllm_omni.diffusion.models.magi2 import layers
    from vllm_omni.diffusion.models.magi2.pipeline_magi2 import DEFAULT_NEGATIVE_PROMPT
    from vllm_omni.diffusion.models.magi2.sampler_magi2 import Magi2PreviewSampler

    torch.set_num_threads(args.threads)
    upstream_patches.init_world_of_one()
    parts = load_components(args.weights)
    parts.image_encoder.load_state_dict(codes.image_encoder_state(parts.config.spatial_stride))
    parts.transformer.eval()
    examples = trainer.make_examples(parts.config, trainer.TrainSettings(scenes=args.scenes))
    proxy = parts.config.data_proxy()
    sampler = Magi2PreviewSampler(parts.transformer, proxy, device="cpu")
    conditioning = trainer.Conditioning(parts.text_encoder,
                                        parts.text_encoder.encode(DEFAULT_NEGATIVE_PROMPT).float())
    pick = list(range(args.scenes))
    patch = parts.config.dit_patch

    mixes: list[torch.Tensor] = []
    original = layers.MHCHandler.compute_post_residual

    def keep_mix(self, post, residual, *, out_dtype):
        post_out, residual_out = original(self, post, residual, out_dtype=out_dtype)
        mixes.append(residual_out.detach().float())
        return post_out, residual_out

    rows = []
    for level in levels:
        draw_sigma = trainer.shifted_sigma
        trainer.shifted_sigma = lambda u, shift=trainer.SHIFT, s=level: s  # every sample at this level
        layers.MHCHandler.compute_post_residual = keep_mix
        mixes.clear()
        try:
            with torch.no_grad():
                model_input, video_target, audio_target, video_weight, _ = trainer.dit_batch(
                    sampler, conditioning, parts.image_encoder, parts.text_encoder, examples, pick, False,
                    torch.Generator().manual_seed(5), uncond_share=0.0)
                packed = proxy.process_input(model_input)
                video, audio = proxy.process_output(parts.transformer(*packed.model_args), packed.output_layout)
        finally:
            trainer.shifted_sigma = draw_sigma
            layers.MHCHandler.compute_post_residual = original
        error = video - video_target  # [B, 48, T, h, w]
        b, c, t, h, w = error.shape
        tokens = error.view(b, c, t, h // patch, patch, w // patch, patch).permute(0, 2, 3, 5, 1, 4, 6)
        tokens = tokens.reshape(-1, c * patch * patch)
        eigenvalues = torch.linalg.eigvalsh(tokens.T @ tokens / tokens.shape[0]).flip(0)
        x0 = torch.stack([examples[i].video for i in pick])
        x0_error = (x0 + level * video_target - level * video) - x0  # x_t = x0 + s (noise - x0)
        on_object = (video_weight > 1).expand_as(x0_error)
        product = None
        for mix in mixes:  # [tokens, 4, 4] per branch of each layer, in forward order
            product = mix if product is None else torch.bmm(mix, product)
        rows.append({
            "s": level,
            "video_velocity_mse": round(error.pow(2).mean().item(), 4),
            "audio_velocity_mse": round((audio - audio_target).pow(2).mean().item(), 4),
            "token_values": int(tokens.shape[1]),
            "error_eigenvalues_top4": [round(v, 3) for v in eigenvalues[:4].tolist()],
            "error_eigenvalues_above_0.5": int((eigenvalues > 0.5).sum()),
            "x0_error_rms_object": round(x0_error[on_object].pow(2).mean().sqrt().item(), 4),
            "x0_error_rms_background": round(x0_error[~on_object].pow(2).mean().sqrt().item(), 4),
            "x0_rms": round(x0.pow(2).mean().sqrt().item(), 4),
            "residual_mixes": len(mixes),
            "residual_product_singular_values": [
                round(v, 4) for v in torch.linalg.svdvals(product).median(0).values.tolist()],
        })
        print(json.dumps(rows[-1]), flush=True)
    result = {"weights": args.weights.name, "scenes": args.scenes, "branch": "conditional", "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
