"""The embedded engine's tiny configuration: MAGI-2 Preview's structure at CPU size.

Everything structural is kept (multimodal end layers, MoE heads with top-k among their own
experts, mHC with 20 Sinkhorn iterations, sink attention with a sigmoid gate, the 64-channel
time embedding, Qwen3.5's hybrid linear/full attention in the text encoder, TurboVAE's up
blocks, Stable Audio's five Oobleck blocks). Only widths, depths and the latent strides
shrink. The config is written into the tiny checkpoint as ``magi2studio-tiny.json``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

TINY_CONFIG_FILE = "magi2studio-tiny.json"


@dataclass(frozen=True)
class TinyConfig:
    seed: int = 0
    # Preview DiT (upstream Magi2PreviewConfig fields).
    num_layers: int = 4
    hidden_size: int = 256
    head_dim: int = 32
    num_query_groups: int = 4
    multimodal_layers: tuple[int, ...] = (0, 3)
    moe_layers: tuple[int, ...] = (1, 2)
    moe_heads: int = 4
    moe_experts: int = 8
    moe_top_k: int = 2
    moe_intermediate: int = 64
    # Text encoder (upstream Magi2Qwen35TextEncoder over a tiny Qwen3.5 text model).
    text_hidden: int = 128
    text_layers: int = 4
    text_vocab: int = 2048
    text_max_length: int = 256
    # Latent geometry: the real VAE strides are (8, 16, 16) in a 25 fps internal timeline;
    # the tiny engine keeps the 25 fps timeline with coarser strides.
    latent_frames: int = 4
    spatial_stride: int = 64
    # The DiT's spatial patch (upstream's data proxy ``patch_size``): a token is p x p latent cells,
    # 48 * p * p wide, so a finer latent grid need not cost the DiT more tokens.
    dit_patch: int = 1
    audio_latent_fps: float = 5.0
    # TurboVAE decoder (upstream Magi2TurboVAEDecoder) and Oobleck audio decoder.
    turbo_channels: tuple[int, ...] = (16, 16)
    # How many of TurboVAE's up blocks (the last ones) double time as well as space; the others
    # double space only. Decoded frames: (T - 1) * 2 ** this + 1.
    turbo_time_upsamplings: int = 1
    audio_decoder_channels: int = 8
    audio_strides: tuple[int, ...] = (2, 2, 2, 2, 2)
    # Oobleck's c_mults (the decoder narrows from channels * the last to channels * 1); empty: all 1.
    audio_decoder_multiples: tuple[int, ...] = ()
    # Default denoising steps: the tier's own 100 (about 15 s at 272p on 2 cores).
    default_steps: int = 100
    default_refiner_steps: int = 5
    # Refiner DiT (1080p): dense, GQA 4:1 as the real 32 query heads over 8 KV groups, the
    # multimodal first-two/last-two layers of Sand AI's mm_layers (0, 1, 28, 29 of 30), and
    # block-window attention in every layer (local_attn_layers is all 30 layers).
    refiner_num_layers: int = 6
    refiner_num_query_groups: int = 2
    refiner_multimodal_layers: tuple[int, ...] = (0, 1, 4, 5)
    refiner_local_attn_layers: tuple[int, ...] = (0, 1, 2, 3, 4, 5)
    # The refiner latent: the real strides go from (8, 16, 16) to (4, 16, 16), so the refiner
    # has 2T-1 latent frames; spatially it is 1920x1088 at the tiny stride (17 x 30).
    # Sand AI's blocks are 8 x 4 x 4 latent tokens: the real 63 x 68 x 120 grid is 8 x 17 x 30
    # blocks and a radius-2 window sees ~6% of it. The tiny grid is 7 x 17 x 30 tokens; 1 x 2 x 2
    # blocks (7 x 9 x 15) keep the radius and a window of ~13% (8 x 4 x 4 would be one block in
    # time and 5 x 8 blocks in space: nearly full attention).
    refiner_block_t: int = 1
    refiner_block_hw: int = 2
    refiner_block_radius: int = 2
    extra: dict = field(default_factory=dict)

    @property
    def num_attention_heads(self) -> int:
        return self.hidden_size // self.head_dim

    def preview_config(self):
        """Upstream's own config class at this size."""

        import torch
        from vllm_omni.diffusion.models.magi2.configuration_magi2 import (
            Magi2MoEConfig,
            Magi2PreviewConfig,
        )

        return Magi2PreviewConfig(
            num_layers=self.num_layers,
            hidden_size=self.hidden_size,
            head_dim=self.head_dim,
            num_query_groups=self.num_query_groups,
            video_in_channels=self.video_token_channels,
            text_in_channels=self.text_hidden,
            multimodal_layers=self.multimodal_layers,
            params_dtype=torch.float32,
            moe=Magi2MoEConfig(
                num_heads=self.moe_heads,
                num_experts=self.moe_experts,
                top_k=self.moe_top_k,
                expert_intermediate_size=self.moe_intermediate,
                shared_expert_intermediate_size=self.moe_intermediate,
                modality_shared_expert_intermediate_size=self.moe_intermediate,
                layers=self.moe_layers,
            ),
        )

    @property
    def video_token_channels(self) -> int:
        return 48 * self.dit_patch * self.dit_patch

    def reference_tokens(self, latent) -> list[int]:
        """An I2VA reference latent [..., h, w]'s token grid, as upstream's ``ref_image_feat_len``."""

        return [latent.shape[-2] // self.dit_patch, latent.shape[-1] // self.dit_patch]

    def data_proxy(self):
        """Upstream's packing of the latents into tokens at this config's patch."""

        from vllm_omni.diffusion.models.magi2.preview_data_proxy import Magi2DataProxy, Magi2PreviewDataProxyConfig

        return Magi2DataProxy(Magi2PreviewDataProxyConfig(patch_size=self.dit_patch))

    @property
    def refiner_latent_frames(self) -> int:
        return 2 * self.latent_frames - 1

    def refiner_config(self):
        """Upstream's config class for the dense refiner: no MoE layer (``layers=()``)."""

        import torch
        from vllm_omni.diffusion.models.magi2.configuration_magi2 import Magi2MoEConfig, Magi2PreviewConfig

        return Magi2PreviewConfig(
            num_layers=self.refiner_num_layers,
            hidden_size=self.hidden_size,
            head_dim=self.head_dim,
            num_query_groups=self.refiner_num_query_groups,
            video_in_channels=self.video_token_channels,
            text_in_channels=self.text_hidden,
            multimodal_layers=self.refiner_multimodal_layers,
            params_dtype=torch.float32,
            # Dense: every layer builds Magi2MLP. The head count only has to divide the width.
            moe=Magi2MoEConfig(num_heads=self.moe_heads, layers=()),
        )

    def refiner_window(self):
        from .block_window import BlockWindow

        return BlockWindow(block_t=self.refiner_block_t, block_h=self.refiner_block_hw,
                           block_w=self.refiner_block_hw, radius_t=self.refiner_block_radius,
                           radius_h=self.refiner_block_radius, radius_w=self.refiner_block_radius)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:12]

    @classmethod
    def from_json(cls, text: str) -> TinyConfig:
        data = json.loads(text)
        for key in ("multimodal_layers", "moe_layers", "turbo_channels", "audio_strides", "audio_decoder_multiples",
                    "refiner_multimodal_layers", "refiner_local_attn_layers"):
            data[key] = tuple(data[key])
        return cls(**data)
