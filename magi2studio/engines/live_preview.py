"""Live preview: the sampler's clean-video estimate, every few steps, as a small moving picture.

At a step's end upstream's scheduler holds its x0 prediction (``FlowUniPCMultistepScheduler``
with ``predict_x0``: ``model_outputs[-1] = sample - sigma * velocity``). A fitted linear map
(:class:`LinearPreviewMap`, one least-squares fit per video decoder, stored in
``magi2studio/data/preview/``) turns each latent cell into a ``patch x patch`` RGB patch: a
few latent frames become a small GIF, no VAE involved. The step hook (:mod:`.timing`) calls
:meth:`LivePreview.after_step`.

No device sync inside the loop: on a device the map runs there, its uint8 result is copied to
pinned host memory with ``non_blocking`` and an event is recorded; a later step's end polls the
event (``query``, never ``synchronize``) and writes the picture once it is done. The sample's
end (:meth:`LivePreview.flush`, after the timer's own one sync) writes what is still pending.

What the folder holds: ``preview-<stage>-<step>.gif`` (the newest two are kept) and
``preview.json`` naming the newest, both written atomically; readers read ``preview.json``
(:class:`NewestPreview`, which every engine's progress events use).
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PREVIEW_MAPS = Path(__file__).resolve().parents[1] / "data" / "preview"
PREVIEW_INFO = "preview.json"
MAX_FRAMES = 8  # latent frames shown, evenly picked
MIN_SIDE = 96  # the picture is enlarged (nearest) until its shorter side is at least this
FRAME_MS = 250
KEEP = 2  # pictures kept in the folder: the newest and the one a reader may still be opening


def default_every(steps: int) -> int:
    """About ten previews a run."""

    return max(1, steps // 10)


@dataclass(frozen=True)
class LinearPreviewMap:
    """Latent cell (``channels``) -> ``patch x patch`` RGB in [-1, 1]: ``rgb = latent @ weight + bias``."""

    name: str
    decoder_sha256: str
    weight: np.ndarray  # float32 [channels, 3 * patch * patch], columns ordered (colour, row, column)
    bias: np.ndarray  # float32 [3 * patch * patch]
    patch: int
    fit: dict[str, Any]  # how it was fitted: script, seed, samples, PSNR on held-out latents

    @property
    def channels(self) -> int:
        return int(self.weight.shape[0])

    @classmethod
    def read(cls, path: str | Path) -> LinearPreviewMap:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls(data["name"], data["decoder_sha256"], np.asarray(data["weight"], dtype=np.float32),
                   np.asarray(data["bias"], dtype=np.float32), int(data["patch"]), data["fit"])

    def write(self, path: str | Path) -> None:
        data = {"name": self.name, "decoder_sha256": self.decoder_sha256, "patch": self.patch, "fit": self.fit,
                "weight": np.round(self.weight, 6).tolist(), "bias": np.round(self.bias, 6).tolist()}
        Path(path).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")

    def tensors(self, device) -> tuple[Any, Any]:
        """The weight and bias on ``device``; to a GPU from pinned memory, ``non_blocking`` (no sync)."""

        import torch

        weight, bias = torch.from_numpy(self.weight), torch.from_numpy(self.bias)
        if torch.device(device).type == "cuda":
            return weight.pin_memory().to(device, non_blocking=True), bias.pin_memory().to(device, non_blocking=True)
        return weight.to(device), bias.to(device)

    def apply(self, latent, tensors: tuple[Any, Any] | None = None):
        """torch ``[C, T, h, w]`` -> uint8 ``[T, h * patch, w * patch, 3]`` on the latent's device.

        ``tensors``: :meth:`tensors` for that device, made once by the caller (a loop's previews)."""

        import torch

        weight, bias = tensors or self.tensors(latent.device)
        channels, frames, height, width = latent.shape
        flat = latent.float().permute(1, 2, 3, 0).reshape(-1, channels)
        rgb = torch.addmm(bias, flat, weight).reshape(frames, height, width, 3, self.patch, self.patch)
        rgb = rgb.permute(0, 1, 4, 2, 5, 3).reshape(frames, height * self.patch, width * self.patch, 3)
        return rgb.mul(127.5).add(127.5).clamp(0, 255).to(torch.uint8)


def fit_linear_map(latents: np.ndarray, targets: np.ndarray, patch: int) -> tuple[np.ndarray, np.ndarray]:
    """Least squares from latent cells ``[N, C]`` to their decoded patches ``[N, 3 * patch * patch]``."""

    design = np.concatenate([latents, np.ones((len(latents), 1), dtype=latents.dtype)], axis=1)
    solution, *_ = np.linalg.lstsq(design.astype(np.float64), targets.astype(np.float64), rcond=None)
    return solution[:-1].astype(np.float32), solution[-1].astype(np.float32)


def decoder_digest(decoder_folder: str | Path) -> str:
    """sha256 over a TurboVAE folder's config files and its weights' names and values (not the
    checkpoint's bytes: ``torch.save`` writes a random serialization id, so a regenerated seeded
    checkpoint has other bytes and the same weights)."""

    import hashlib

    import torch

    folder = Path(decoder_folder)
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.json")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key in sorted(value):
                walk(f"{prefix}/{key}", value[key])
        elif isinstance(value, torch.Tensor):
            digest.update(f"{prefix}:{value.dtype}:{tuple(value.shape)}".encode())
            digest.update(value.detach().contiguous().cpu().numpy().tobytes())

    for path in sorted(folder.glob("*.ckpt")):
        walk(path.name, torch.load(path, map_location="cpu", weights_only=True))
    return digest.hexdigest()


def map_for_decoder(decoder_sha256: str, folder: Path = PREVIEW_MAPS) -> Path | None:
    """The committed map's file fitted to this decoder, or None (the preview then says it has none)."""

    for path in sorted(folder.glob("*.json")):
        if json.loads(path.read_text(encoding="utf-8")).get("decoder_sha256") == decoder_sha256:
            return path
    return None


def pick_frames(count: int, limit: int = MAX_FRAMES) -> slice:
    """At most ``limit`` evenly strided latent frames: a slice, so a device tensor is only viewed
    (a list index would be copied to the device from pageable memory, a sync)."""

    return slice(None, None, -(-count // limit))


def encode_gif(frames: np.ndarray) -> bytes:
    """uint8 ``[T, H, W, 3]`` -> an endlessly looping GIF, enlarged (nearest) to a visible size.

    One palette for all frames (fast octree over the frames stacked), found at the map's own size
    and enlarged as palette indices: quantizing each enlarged frame with PIL's default median cut
    took 39 ms for the tiny 272p picture and 414 ms for the real 272p latent's 8 frames on this
    2-core CPU, against 5 and 13 ms this way (docs/performance.md, "Live preview")."""

    from PIL import Image

    count, height, width, _ = frames.shape
    scale = max(1, -(-MIN_SIDE // min(height, width)))
    strip = Image.fromarray(np.ascontiguousarray(frames).reshape(count * height, width, 3))
    strip = strip.quantize(colors=256, method=Image.Quantize.FASTOCTREE)
    if scale > 1:
        strip = strip.resize((width * scale, count * height * scale), Image.Resampling.NEAREST)
    side = height * scale
    images = [strip.crop((0, i * side, width * scale, (i + 1) * side)) for i in range(count)]
    buffer = io.BytesIO()
    images[0].save(buffer, format="GIF", save_all=True, append_images=images[1:], duration=FRAME_MS, loop=0)
    return buffer.getvalue()


def _write_atomic(path: Path, data: bytes) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_bytes(data)
    os.replace(temp, path)


def read_latest(folder: str | Path) -> dict[str, Any] | None:
    """``preview.json`` of ``folder`` with ``path`` (the picture) filled in, or None before the first."""

    info_path = Path(folder) / PREVIEW_INFO
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return {**info, "path": str(Path(folder) / info["image"])}


class NewestPreview:
    """A run's preview folder as its progress events see it: each new picture is named once."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.shown: set[str] = set()

    def take(self) -> str | None:
        """The newest picture's path if no earlier event named it, else None."""

        latest = read_latest(self.folder)
        if latest is None or latest["path"] in self.shown:
            return None
        self.shown.add(latest["path"])
        return latest["path"]


def preview_note(every: int, preview_map: Path | None) -> dict[str, Any] | str:
    """The manifest's ``resolved.live_preview``: the rate and map, or why there is none."""

    if preview_map is None:
        return "off: no preview map fitted to this decoder"
    return {"every": every, "map": preview_map.stem} if every else "off"


class LivePreview:
    """Writes the x0 estimate of every ``every``-th step (and the last) into ``folder``."""

    def __init__(self, folder: str | Path, every: int, preview_map: LinearPreviewMap) -> None:
        self.folder = Path(folder)
        self.every = every
        self.map = preview_map
        self.written: list[dict[str, Any]] = []
        self._pending: list[tuple[Any, Any, dict[str, Any]]] = []  # (host uint8, event or None, info)
        self._tensors: tuple[Any, Any] | None = None  # the map on the estimate's device, uploaded once

    def wanted(self, index: int, total: int) -> bool:
        return self.every > 0 and ((index + 1) % self.every == 0 or index + 1 == total)

    def after_step(self, stage: str, index: int, total: int, video_scheduler: Any) -> None:
        """Queue this step's picture if wanted; write the pictures whose copies have landed."""

        self.poll()
        if not self.wanted(index, total) or not getattr(video_scheduler, "predict_x0", False):
            return
        estimate = video_scheduler.model_outputs[-1]
        if estimate is None or estimate.shape[1] != self.map.channels:
            return
        latent = estimate[0, :, pick_frames(estimate.shape[2])]
        if self._tensors is None or self._tensors[0].device != latent.device:
            self._tensors = self.map.tensors(latent.device)
        small = self.map.apply(latent, self._tensors)
        info = {"stage": stage, "step": index, "total": total, "frames": int(small.shape[0]),
                "height": int(small.shape[1]), "width": int(small.shape[2])}
        host, event = self._start_copy(small)
        self._pending.append((host, event, info))
        self.poll()

    @staticmethod
    def _start_copy(small: Any) -> tuple[Any, Any]:
        """A device picture: an async copy into pinned memory and its event; a host one: itself, no event."""

        if not small.is_cuda:
            return small, None
        import torch

        host = torch.empty(small.shape, dtype=torch.uint8, pin_memory=True)
        host.copy_(small, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return host, event

    def poll(self) -> None:
        """Write every pending picture whose copy is done (``Event.query``: no wait)."""

        while self._pending and (self._pending[0][1] is None or self._pending[0][1].query()):
            host, _, info = self._pending.pop(0)
            self._write(host.numpy(), info)

    def flush(self) -> None:
        """After the loop: wait for and write what is still pending."""

        for _, event, _ in self._pending:
            if event is not None:
                event.synchronize()
        self.poll()

    def _write(self, frames: np.ndarray, info: dict[str, Any]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"preview-{info['stage']}-{info['step']:04d}.gif"
        _write_atomic(self.folder / name, encode_gif(frames))
        _write_atomic(self.folder / PREVIEW_INFO, json.dumps({**info, "image": name}).encode("utf-8"))
        self.written.append({**info, "image": name})
        if len(self.written) > KEEP:
            (self.folder / self.written[-KEEP - 1]["image"]).unlink(missing_ok=True)
