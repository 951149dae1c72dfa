"""A finished ``OmniRequestOutput`` -> the arrays every engine returns.

MAGI-2's pipeline puts the clip in ``.images[0]`` (uint8 [frames, H, W, 3]) and the audio in
``.multimodal_output["audio"]`` (float [samples, channels], ``audio_sample_rate`` 44100),
with ``fps`` 12.5 beside it. ``stage_durations`` mixes units: the pipeline's own stages are seconds,
while the orchestrator merges in keys that end in ``_ms`` (``queue_wait_ms``, ``stage_N_gen_ms``) in
milliseconds already (vllm_omni/entrypoints/omni_base.py). The first run on a GPU showed
``stage_0_gen_ms`` a thousand times too large when every key was scaled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import EngineError


@dataclass
class MappedOutput:
    frames: np.ndarray
    audio: np.ndarray
    fps: float
    sample_rate: int
    stage_ms: dict[str, float]


def _numpy(value) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def map_output(output) -> MappedOutput:
    """Check and convert one request's output; a malformed one is an EngineError, not a bad file."""

    if getattr(output, "error", None):
        raise EngineError(f"vLLM-Omni reported: {output.error}")
    if not output.images:
        raise EngineError("vLLM-Omni returned no video (OmniRequestOutput.images is empty)")
    frames = _numpy(output.images[0])
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise EngineError(f"expected uint8 video [frames, H, W, 3], got {frames.dtype} {tuple(frames.shape)}")
    media = output.multimodal_output or {}
    if media.get("audio") is None:
        raise EngineError("vLLM-Omni returned no audio (multimodal_output['audio'] is missing)")
    audio = _numpy(media["audio"]).astype(np.float32, copy=False)
    if audio.ndim != 2 or audio.shape[1] > audio.shape[0]:
        raise EngineError(f"expected audio [samples, channels], got {tuple(audio.shape)}")
    sample_rate = media.get("audio_sample_rate")
    fps = media.get("fps")
    if sample_rate is None or fps is None:
        raise EngineError(f"vLLM-Omni's output lacks audio_sample_rate or fps (keys: {sorted(media)})")
    stage_ms = {name: float(value) * (1.0 if name.endswith("_ms") else 1e3)
                for name, value in (output.stage_durations or {}).items()}
    return MappedOutput(np.ascontiguousarray(frames), np.ascontiguousarray(audio), float(fps), int(sample_rate),
                        stage_ms)
