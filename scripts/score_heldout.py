#!/usr/bin/env python3
"""Generate the held-out captions on the embedded engine and score each run (``magi2studio score``).

    .venv/bin/python scripts/score_heldout.py --weights /tmp/tiny-trained --out /tmp/heldout-trained.json
    .venv/bin/python scripts/score_heldout.py --weights random --out /tmp/heldout-random.json

Each held-out combination (magi2studio.semantic.scenes.HELD_OUT, never trained on) is captioned with
its grammar phrasing ``index % PHRASINGS``, generated at the tier with the default steps into a
run folder under ``--runs``, and judged by :func:`magi2studio.semantic.score.score_run`, the function
behind ``magi2studio score RUN``. The JSON holds every verdict and the share of runs matching
per attribute; the table printed last is that share.

``--decode-codes`` skips the DiT: each held-out scene's own latent codes
(magi2studio.training.latents) go through the checkpoint's decoders and the driver's decode
steps, and the clip is scored against its caption. That is the most the DiT could reach with
these decoders (and says nothing about the DiT). ``--code-inverse`` scores the code's exact
inverse instead of the video decoder: each cell's colour back over its pixels at each decoded
frame (``latents.decode_exact``), what the set decoder computes to ~1e-4 (docs/training.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ATTRIBUTES = ("background", "colour", "shape", "motion", "pitch", "beeps", "first_frame")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--weights", default="random", help="random or a tiny checkpoint folder")
    parser.add_argument("--tier", default="272p")
    parser.add_argument("--steps", type=int, default=None, help="denoising steps (default: the engine's)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N held-out combinations")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--runs", type=Path, default=None, help="run folders go here (default: a temp folder)")
    parser.add_argument("--out", type=Path, required=True, help="JSON results file")
    parser.add_argument("--decode-codes", action="store_true", help="score the decoders on the scenes' own codes")
    parser.add_argument("--code-inverse", action="store_true",
                        help="with --decode-codes: the code's exact inverse in place of the video decoder")
    args = parser.parse_args(argv)
    if args.code_inverse and not args.decode_codes:
        parser.error("--code-inverse: it replaces the video decoder on the scenes' codes; add --decode-codes")

    from magi2studio.determinism import apply_defaults

    apply_defaults()
    from magi2studio.run_folder import runs
    from magi2studio.engines.embedded import EmbeddedEngine
    from magi2studio.vocabulary.layouts import parse_layout
    from magi2studio.vocabulary.request import Request
    from magi2studio.semantic.scenes import HELD_OUT, PHRASINGS, caption_for
    from magi2studio.semantic.score import score_run

    from magi2studio.errors import InputError

    try:
        engine = EmbeddedEngine(weights=args.weights)
    except InputError as error:
        print(f"score_heldout.py: {error}", file=sys.stderr)
        return 2
    runs_root = args.runs or Path(tempfile.mkdtemp(prefix="heldout-"))
    layout = parse_layout("sp1-cfg1")
    driver = _decoding_driver(engine) if args.decode_codes else None
    results = []
    for index, facts in enumerate(HELD_OUT[: args.limit]):
        caption = caption_for(facts, index % PHRASINGS)
        started = time.perf_counter()
        if args.decode_codes:
            score = _decode_codes(driver, engine.config, facts, args.tier, args.seed + index, args.code_inverse)
            where = "code inverse" if args.code_inverse else "codes"
        else:
            request = Request(prompt=caption, seed=args.seed + index, tier=args.tier, steps=args.steps)
            folder = runs.execute(engine, request, layout, runs_root)
            score, where = score_run(folder.path), str(folder.path)
        seconds = time.perf_counter() - started
        verdicts = {v.attribute: v.match for v in score.verdicts}
        results.append({"run": where, "seconds": round(seconds, 2), **score.as_dict()})
        print(f"{index:2d} {seconds:5.1f} s  " + " ".join(f"{a}={'Y' if m else 'n' if m is False else '-'}"
                                                      for a, m in verdicts.items()) + f"  | {caption}", flush=True)
    info = engine.info()
    if driver is not None:  # no ranks ran; the decoders came from this checkpoint
        info["checkpoint"] = str(driver.c.root)
    engine.close()
    rates = {}
    for attribute in ATTRIBUTES:
        judged = [v["match"] for r in results for v in r["verdicts"] if v["attribute"] == attribute
                  and v["match"] is not None]
        if judged:
            rates[attribute] = round(sum(judged) / len(judged), 3)
    summary = {"weights": args.weights, "tier": args.tier, "steps": args.steps, "runs": len(results),
               "match_rate": rates, "engine": info, "results": results}
    temp = args.out.with_name(f".{args.out.name}.tmp")
    temp.write_text(json.dumps(summary, indent=1, default=str), encoding="utf-8")
    temp.replace(args.out)
    print(json.dumps({"weights": args.weights, "runs": len(results), "match_rate": rates}))
    return 0


def _decoding_driver(engine):
    """The engine's checkpoint loaded in this process as a rank loads it, for its decoders only."""

    from magi2studio.engines.embedded import upstream_patches
    from magi2studio.engines.embedded.rank import load_driver

    upstream_patches.init_world_of_one()  # released when the script exits
    return load_driver(engine.checkpoint())


def _decode_codes(driver, config, facts, tier_name: str, seed: int, code_inverse: bool = False):
    """A held-out scene's own latent codes through the checkpoint's decoders (or the video code's
    exact inverse), scored."""

    import torch

    from magi2studio.semantic.scenes import make_scene
    from magi2studio.semantic.score import score_clip
    from magi2studio.vocabulary.tiers import AUDIO_SAMPLE_RATE, get_tier
    from magi2studio.training import latents as codes

    tier = get_tier(tier_name)
    scene = make_scene(facts, tier, seed)
    video = codes.encode_scene(scene, config.spatial_stride, config.latent_frames)[0].unsqueeze(0)
    audio = codes.encode_audio(scene, config.audio_latent_fps).unsqueeze(0)
    with torch.inference_mode():  # as the driver's run is
        clip = _code_inverse(video, tier) if code_inverse else driver.decode_video(video, tier)
        pcm = driver.decode_audio(audio, tier.seconds)
    return score_clip(facts, clip, pcm, tier.fps, AUDIO_SAMPLE_RATE, caption=scene.caption)


def _code_inverse(video, tier):
    """The video code [1, 48, T, h, w] decoded exactly (each cell's colour over its pixels at every
    decoded frame), then shown as the driver shows a decoded clip."""

    import numpy as np
    from vllm_omni.diffusion.models.magi2.pipeline_magi2 import _resize_video

    from magi2studio.training import latents as codes

    frames = codes.decode_exact(video[0])  # [N, 3, h, w]
    pixels = frames.repeat_interleave(codes.CELL, -1).repeat_interleave(codes.CELL, -2)
    small = pixels.mul(0.5).add(0.5).clamp(0, 1).mul(255).byte().permute(0, 2, 3, 1).numpy()
    index = np.floor(np.arange(tier.frames) * len(small) / tier.frames).astype(np.int64)
    return np.ascontiguousarray(_resize_video(small[index], tier.width, tier.height))


if __name__ == "__main__":
    raise SystemExit(main())
