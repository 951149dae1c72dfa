"""Load the embedded engine's components from a checkpoint folder in the released layout.

Upstream classes, at tiny configs: ``Magi2PreviewTransformer`` (loaded with its own strict
``load_weights`` from the safetensors shards via vLLM's iterator), the dense refiner DiT (the
same class with block-window attention in its local layers, from ``refiner/``), ``Magi2Qwen35TextEncoder``,
``Magi2TurboVAEDecoder`` and ``Magi2AudioDecoder``.

One stand-in: upstream's image VAE (``LanceWanVAE``) hard-codes the full Wan2.2 widths, so
it cannot be built small. :class:`TinyImageEncoder` has its ``encode_video`` interface and
output shape ([B, 48, 1, H/s, W/s]) and is stored at the released path ``vae/Wan2.2_VAE.pth``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .tiny import TINY_CONFIG_FILE, TinyConfig

TURBO_CONFIG_NAME = "TurboV3-Wan22-TinyShallow_7_7.json"  # the tiny TurboVAE's config, under turbo_vae/

STAND_INS = {
    "image_vae": "TinyImageEncoder (magi2studio): upstream LanceWanVAE hard-codes Wan2.2's full widths",
    "refiner_decode": "1080p latents decode with the tiny Magi2TurboVAEDecoder, then bilinear to 1920x1088: "
                      "Sand AI's refiner latent (stride 4x16x16) is Wan2.2's, whose LanceWanVAE cannot be built small",
}


class TinyImageEncoder(nn.Module):
    """Stand-in for the Wan2.2 VAE encoder: pixels in [-1, 1] -> a 48-channel latent."""

    def __init__(self, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.patch = nn.Conv2d(3, 48, kernel_size=stride, stride=stride)
        self.mix = nn.Conv2d(48, 48, kernel_size=1)

    @torch.inference_mode()
    def encode_video(self, pixels: torch.Tensor, use_sample: bool = False) -> torch.Tensor:
        del use_sample  # the mean, as upstream's I2VA path asks for
        frames = pixels[:, :, 0]
        latent = self.mix(torch.tanh(self.patch(frames)))
        return latent.unsqueeze(2)


@dataclass
class Components:
    config: TinyConfig
    root: Path
    transformer: nn.Module
    refiner: nn.Module
    text_encoder: nn.Module
    image_encoder: TinyImageEncoder
    video_decoder: nn.Module
    audio_decoder: nn.Module
    loaded_weights: int


def read_tiny_config(root: Path) -> TinyConfig:
    return TinyConfig.from_json((root / TINY_CONFIG_FILE).read_text(encoding="utf-8"))


def dit_shards(root: Path, folder: str = "preview") -> list[Path]:
    index = json.loads((root / folder / "model.safetensors.index.json").read_text(encoding="utf-8"))
    return [root / folder / name for name in sorted(set(index["weight_map"].values()))]


def _load_dit(transformer: nn.Module, root: Path, folder: str) -> tuple[nn.Module, int]:
    """Load a DiT the way the pipeline does (``transformer.`` keys, upstream's strict loader)."""

    from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator

    weights = ((f"transformer.{name}", tensor)
               for name, tensor in safetensors_weights_iterator([str(p) for p in dit_shards(root, folder)], False))
    loaded = transformer.load_weights(weights)
    transformer.eval().requires_grad_(False)
    return transformer, len(loaded)


def load_transformer(config: TinyConfig, root: Path) -> tuple[nn.Module, int]:
    from vllm_omni.diffusion.models.magi2.modeling_magi2 import Magi2PreviewTransformer

    return _load_dit(Magi2PreviewTransformer(config.preview_config()), root, "preview")


def load_refiner(config: TinyConfig, root: Path) -> tuple[nn.Module, int]:
    from .block_window import make_refiner_transformer

    model = make_refiner_transformer(config.refiner_config(), config.refiner_window(), config.refiner_local_attn_layers)
    return _load_dit(model, root, "refiner")


def load_components(root: Path) -> Components:
    from vllm_omni.diffusion.models.magi2.audio_decoder import Magi2AudioDecoder
    from vllm_omni.diffusion.models.magi2.conditioning import Magi2Qwen35TextEncoder
    from vllm_omni.diffusion.models.magi2.turbo_vae import Magi2TurboVAEDecoder

    config = read_tiny_config(root)
    transformer, loaded = load_transformer(config, root)
    refiner, _ = load_refiner(config, root)
    text_encoder = Magi2Qwen35TextEncoder(str(root / "text_encoder"), dtype=torch.float32,
                                          max_length=config.text_max_length)
    image_encoder = TinyImageEncoder(config.spatial_stride)
    image_encoder.load_state_dict(torch.load(root / "vae" / "Wan2.2_VAE.pth", weights_only=True))
    image_encoder.eval().requires_grad_(False)
    video_decoder = Magi2TurboVAEDecoder(root / "turbo_vae" / TURBO_CONFIG_NAME, root / "turbo_vae" / "checkpoint.ckpt",
                                         device="cpu", dtype=torch.float32)
    audio_decoder = Magi2AudioDecoder(root / "stable-audio-open-1.0", device="cpu", dtype=torch.float32)
    return Components(config, root, transformer, refiner, text_encoder, image_encoder, video_decoder, audio_decoder,
                      loaded)
