#!/usr/bin/env python3
"""A run's frames under the scene its caption asks for, with the score's verdicts: one PNG.

    .venv/bin/magi2studio generate --prompt "$(.venv/bin/python -c 'from magi2studio.semantic.scenes import \
        HELD_OUT, caption_for; print(caption_for(HELD_OUT[0]))')" --seed 42 --out /tmp/strip-runs
    .venv/bin/python scripts/frame_strip.py /tmp/strip-runs/<run folder> --out docs/images/heldout-strip.png

Top row: the scene drawn from the run's caption (magi2studio.semantic.scenes.make_scene, the run's
tier and seed: where the object starts is the seed's, so only what the caption fixes need agree);
bottom row: the run's own video.mp4 at the same frame numbers. Under them, ``magi2studio score``'s
verdict lines for the run. The caption must be one the scene grammar reads (parse_caption).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
THUMB_WIDTH = 224  # each frame's width in the strip (272p frames are 448 wide)
GAP, LABEL, LINE = 4, 18, 15


def strip(asked: np.ndarray, got: np.ndarray, count: int, lines: list[str], title: str):
    """Two rows of ``count`` frames at the same evenly spaced frame numbers, labelled, text below."""

    from PIL import Image, ImageDraw

    picks = np.linspace(0, min(len(asked), len(got)) - 1, count).round().astype(int)
    height = round(asked.shape[1] * THUMB_WIDTH / asked.shape[2])
    width = count * THUMB_WIDTH + (count - 1) * GAP
    canvas = Image.new("RGB", (width, LABEL + 2 * (LABEL + height) + LINE * (len(lines) + 1)), "white")
    draw = ImageDraw.Draw(canvas)
    draw.text((0, 2), title, fill="black")
    for row, (name, frames) in enumerate((("asked: the scene the caption describes", asked),
                                          ("got: the run's video.mp4", got))):
        top = LABEL + row * (LABEL + height)
        draw.text((0, top + 2), name, fill="black")
        for column, index in enumerate(picks):
            thumb = Image.fromarray(frames[index]).resize((THUMB_WIDTH, height), Image.Resampling.BILINEAR)
            canvas.paste(thumb, (column * (THUMB_WIDTH + GAP), top + LABEL))
            if row == 1:
                draw.text((column * (THUMB_WIDTH + GAP) + 2, top + LABEL + height - 12), f"frame {index}",
                          fill="white", stroke_width=1, stroke_fill="black")
    for number, line in enumerate(lines):
        draw.text((0, LABEL + 2 * (LABEL + height) + 4 + number * LINE), line, fill="black")
    return canvas


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="a run folder written by magi2studio")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--frames", type=int, default=8, help="frames in each row (2 to 16)")
    args = parser.parse_args(argv)
    if not 2 <= args.frames <= 16:
        print(f"frame_strip.py: --frames: {args.frames} is out of range. Fix: use 2 to 16", file=sys.stderr)
        return 2
    if not args.out.parent.is_dir():  # before the run is scored, not a traceback after it
        print(f"frame_strip.py: out: {args.out.parent} is not a folder. Fix: create it or pick another --out",
              file=sys.stderr)
        return 2

    from magi2studio.errors import InputError
    from magi2studio.media import decode_mp4
    from magi2studio.run_folder import runs
    from magi2studio.engines.embedded.tiny_weights import TRAINED_SHA256
    from magi2studio.semantic.scenes import make_scene, parse_caption
    from magi2studio.semantic.score import score_run
    from magi2studio.vocabulary.tiers import get_tier

    try:
        folder = runs.load_run(args.run)
        request = folder.manifest["request"]
        facts = parse_caption(request["prompt"])
        score = score_run(args.run)
    except InputError as error:
        print(f"frame_strip.py: {error}", file=sys.stderr)
        return 2
    tier = get_tier(request["tier"])
    asked = make_scene(facts, tier, int(request["seed"])).frames()
    got = decode_mp4(folder.video.read_bytes())[0]
    engine = folder.manifest["engine"]
    weights = "trained (shipped)" if engine.get("weights_sha256") == TRAINED_SHA256 else engine.get("weights")
    title = (f"\"{request['prompt']}\" - {tier.name}, seed {request['seed']}, "
             f"{folder.manifest['resolved'].get('steps')} steps, weights {weights}")
    lines = [v.line().replace("\u2014", "-") for v in score.verdicts]  # the built-in font has no em dash
    image = strip(asked, got, args.frames, lines, title)
    temp = args.out.with_name(f".{args.out.name}.tmp")
    image.save(temp, format="PNG")
    temp.replace(args.out)
    print(f"wrote {args.out} ({image.size[0]}x{image.size[1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
