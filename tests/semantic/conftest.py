"""Run folders made from generated scenes through the project's own writer, so the semantic
check reads them exactly as it reads an engine's run."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from PIL import Image

from magi2studio.run_folder import runs
from magi2studio.engines.base import Generation, Plan
from magi2studio.vocabulary.layouts import parse_layout
from magi2studio.vocabulary.request import build_request
from magi2studio.semantic.scenes import Scene


def write_scene_run(scene: Scene, root: Path, *, caption: str | None = None, frames: np.ndarray | None = None,
                    audio: np.ndarray | None = None, image: Path | None = None) -> Path:
    """The scene as a run folder (its caption as the prompt); ``image`` makes it I2VA."""

    frames = scene.frames() if frames is None else frames
    audio = scene.audio() if audio is None else audio
    fields = dict(prompt=caption or scene.caption, tier=scene.tier.name, seed=scene.seed, steps=1)
    if image is not None:
        fields.update(mode="i2va", image=str(image))
    generation = Generation(frames=frames, audio=audio, fps=scene.fps, sample_rate=scene.sample_rate,
                            step_records=[], stage_ms={}, resolved={"steps": 1},
                            engine_info={"name": "scenes", "embedded": False})
    plan = Plan(build_request(**fields), scene.tier, parse_layout("sp1-cfg1"), generation.resolved)
    return runs.write_run(root, plan, generation, time.time()).path


def save_first_frame(scene: Scene, path: Path) -> Path:
    Image.fromarray(next(scene.iter_frames())).save(path)
    return path
