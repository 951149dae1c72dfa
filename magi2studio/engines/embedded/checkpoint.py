"""Generate the tiny checkpoint in the released ``sand-ai/MAGI-2-preview`` folder layout.

The tree is what the real engine expects (``preview/model.safetensors.index.json`` + shards,
``refiner/`` the same way for the 1080p refiner DiT, ``text_encoder/``, ``vae/Wan2.2_VAE.pth``,
``turbo_vae/``, ``stable-audio-open-1.0/``), with seeded random weights, so the engine loads it
through upstream's loading code. The one stand-in is the image encoder under ``vae/`` (see
:mod:`.components`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch

from .components import TURBO_CONFIG_NAME, TinyImageEncoder
from .tiny import TINY_CONFIG_FILE, TinyConfig

DEFAULT_ROOT = Path(os.environ.get("MAGI2_TINY_CKPT", Path.home() / ".cache" / "magi2studio"))
TOKENIZER_CORPUS = Path(__file__).with_name("tokenizer_corpus.txt")
# Bump when the generated tree changes, so a cached older tree is not reused.
CHECKPOINT_FORMAT = 3  # 3: refiner/


def checkpoint_dir(config: TinyConfig, root: Path | None = None) -> Path:
    return Path(root or DEFAULT_ROOT) / f"tiny-{config.digest}-v{CHECKPOINT_FORMAT}"


def ensure_checkpoint(config: TinyConfig, root: Path | None = None) -> Path:
    """Return the tiny checkpoint folder, generating it (atomically) on first use."""

    final = checkpoint_dir(config, root)
    if (final / TINY_CONFIG_FILE).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        write_checkpoint(config, temp)
        try:
            os.rename(temp, final)
        except OSError:  # another process finished first
            if not (final / TINY_CONFIG_FILE).is_file():
                raise
            shutil.rmtree(temp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return final


def _init_tensor(name: str, tensor: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Seeded values with sane scales: fan-in scaled matrices, unit norms, small vectors."""

    if tensor.dtype in (torch.int32, torch.int64, torch.bool):
        return torch.zeros_like(tensor)
    shape = tuple(tensor.shape)
    if len(shape) >= 2:
        fan_in = math.prod(shape[1:])
        values = torch.randn(shape, generator=generator) / math.sqrt(fan_in)
    elif "norm" in name or name.endswith((".weight", "_g", ".alpha", ".beta")):
        values = 1.0 + 0.02 * torch.randn(shape, generator=generator)
    else:
        values = 0.02 * torch.randn(shape, generator=generator)
    return values.to(tensor.dtype)


def _seeded_state(module: torch.nn.Module, generator: torch.Generator) -> dict[str, torch.Tensor]:
    return {name: _init_tensor(name, t, generator).contiguous()
            for name, t in module.state_dict().items()}


def write_checkpoint(config: TinyConfig, root: Path) -> None:
    generator = torch.Generator().manual_seed(config.seed)
    _write_preview(config, root / "preview", generator)
    _write_refiner(config, root / "refiner", generator)
    _write_text_encoder(config, root / "text_encoder", generator)
    _write_image_encoder(config, root / "vae", generator)
    _write_turbo_vae(config, root / "turbo_vae", generator)
    _write_audio_decoder(config, root / "stable-audio-open-1.0", generator)
    (root / TINY_CONFIG_FILE).write_text(config.to_json(), encoding="utf-8")


def _write_preview(config: TinyConfig, folder: Path, generator: torch.Generator) -> None:
    from vllm_omni.diffusion.models.magi2.modeling_magi2 import Magi2PreviewTransformer

    with torch.device("meta"):
        model = Magi2PreviewTransformer(config.preview_config())
    _write_dit(config, model, folder, generator)


def _write_refiner(config: TinyConfig, folder: Path, generator: torch.Generator) -> None:
    from .block_window import make_refiner_transformer

    with torch.device("meta"):
        model = make_refiner_transformer(config.refiner_config(), config.refiner_window(),
                                         config.refiner_local_attn_layers)
    _write_dit(config, model, folder, generator)


def _write_dit(config: TinyConfig, model: torch.nn.Module, folder: Path, generator: torch.Generator) -> None:
    """Seeded weights of a DiT as an index + 2 safetensors shards (the released layout)."""

    state = {name: _init_tensor(name, torch.empty(t.shape, dtype=t.dtype), generator)
             for name, t in model.state_dict().items()}
    write_dit_state(config, state, folder)


def write_dit_state(config: TinyConfig, state: dict[str, torch.Tensor], folder: Path) -> None:
    """A DiT state dict as an index + 2 safetensors shards (the released layout)."""

    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    names = sorted(state)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    weight_map = {}
    total = 0
    for shard, shard_names in shards.items():
        save_file({n: state[n] for n in shard_names}, str(folder / shard), metadata={"format": "pt"})
        for n in shard_names:
            weight_map[n] = shard
            total += state[n].numel() * state[n].element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")
    (folder / "config.json").write_text(json.dumps({"magi2studio_tiny": config.digest}), encoding="utf-8")


def _write_text_encoder(config: TinyConfig, folder: Path, generator: torch.Generator) -> None:
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3_5TextConfig, Qwen3_5TextModel

    folder.mkdir(parents=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.text_vocab, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train([str(TOKENIZER_CORPUS)], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>")
    fast.save_pretrained(str(folder))

    layer_types = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
    text_config = Qwen3_5TextConfig(
        vocab_size=len(fast), hidden_size=config.text_hidden, intermediate_size=2 * config.text_hidden,
        num_hidden_layers=config.text_layers, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        layer_types=(layer_types * config.text_layers)[: config.text_layers], max_position_embeddings=4096,
    )
    text_config.architectures = ["Qwen3_5TextModel"]
    with torch.device("meta"):
        model = Qwen3_5TextModel(text_config)
    state = {name: _init_tensor(name, torch.empty(t.shape, dtype=torch.float32), generator)
             for name, t in model.state_dict().items()}
    text_config.save_pretrained(str(folder))
    # Sharded with an index, as the released text_encoder/ is (upstream requires the index).
    shard = "model-00001-of-00001.safetensors"
    save_file(state, str(folder / shard), metadata={"format": "pt"})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
             "weight_map": {name: shard for name in sorted(state)}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")


def _write_image_encoder(config: TinyConfig, folder: Path, generator: torch.Generator) -> None:
    folder.mkdir(parents=True)
    encoder = TinyImageEncoder(config.spatial_stride)
    torch.save(_seeded_state(encoder, generator), folder / "Wan2.2_VAE.pth")


def turbo_config(config: TinyConfig) -> dict:
    """Every up block doubles space; the last ``turbo_time_upsamplings`` of them double time too
    (upstream lists the blocks last first), then the 2 x 2 unpatchify."""

    blocks, in_time = len(config.turbo_channels), config.turbo_time_upsamplings
    if not 0 < in_time <= blocks:
        raise ValueError(f"turbo_time_upsamplings: {in_time} of {blocks} up blocks. Fix: 1 to {blocks}")
    return {
        "latent_channels": 48,
        "out_channels": 3,
        "first_chunk_size": config.latent_frames,
        "step_size": 4,
        "temporal_compression_ratio": 2 ** in_time,
        "spatial_compression_ratio": 2 ** blocks * 2,
        "decoder_block_out_channels": list(config.turbo_channels),
        "decoder_layers_per_block": [1] * (blocks + 1),
        "decoder_spatio_temporal_scaling": [True] * blocks,
        "decoder_spatio_only": [False] * in_time + [True] * (blocks - in_time),
        "patch_size": 2,
        "decoder_causal": False,
        "use_unpatchify": True,
        "decoder_is_dw_conv": [],
    }


def turbo_decoder(spec: dict):
    """Upstream's TurboVAE decoder built from a TurboVAE config (its released json's keys)."""
    from vllm_omni.diffusion.models.magi2.turbo_vae import _TurboDecoder3d

    return _TurboDecoder3d(
        latent_channels=spec["latent_channels"], out_channels=spec["out_channels"],
        block_out_channels=tuple(spec["decoder_block_out_channels"]),
        layers_per_block=tuple(spec["decoder_layers_per_block"]),
        spatio_temporal_scaling=tuple(spec["decoder_spatio_temporal_scaling"]),
        spatio_only=tuple(spec["decoder_spatio_only"]), patch_size=spec["patch_size"],
        decoder_causal=spec["decoder_causal"], use_unpatchify=spec["use_unpatchify"],
    )


def _write_turbo_vae(config: TinyConfig, folder: Path, generator: torch.Generator) -> None:
    folder.mkdir(parents=True)
    spec = turbo_config(config)
    (folder / TURBO_CONFIG_NAME).write_text(json.dumps(spec, indent=2), encoding="utf-8")
    decoder = turbo_decoder(spec)
    state = {f"module.decoder.{k}": v for k, v in _seeded_state(decoder, generator).items()}
    torch.save({"ema_state_dict": state}, folder / "checkpoint.ckpt")


def stable_audio_key(diffusers_key: str) -> str:
    """The released Stable Audio name of a Diffusers Oobleck decoder key.

    The inverse of upstream's ``convert_stable_audio_decoder_key``; checked against it below.
    """

    residual_index = {"snake1": 0, "conv1": 1, "snake2": 2, "conv2": 3}
    parts = diffusers_key.split(".")
    prefix = "pretransform.model.decoder.layers."
    if parts[0] == "conv1":
        return f"{prefix}0.{parts[1]}"
    if parts[0] == "snake1":
        return f"{prefix}6.{parts[1]}"
    if parts[0] == "conv2":
        return f"{prefix}7.{parts[1]}"
    block = int(parts[1]) + 1
    if parts[2] == "snake1":
        return f"{prefix}{block}.layers.0.{parts[3]}"
    if parts[2] == "conv_t1":
        return f"{prefix}{block}.layers.1.{parts[3]}"
    unit = int(parts[2].removeprefix("res_unit")) + 1
    return f"{prefix}{block}.layers.{unit}.layers.{residual_index[parts[3]]}.{parts[4]}"


def _write_audio_decoder(config: TinyConfig, folder: Path, generator: torch.Generator) -> None:
    from diffusers import AutoencoderOobleck
    from safetensors.torch import save_file
    from vllm_omni.diffusion.models.magi2.audio_decoder import convert_stable_audio_decoder_key

    folder.mkdir(parents=True)
    strides = list(config.audio_strides)
    channels = config.audio_decoder_channels
    multiples = list(config.audio_decoder_multiples) or [1] * len(strides)
    model_config = {
        "sample_rate": 44100,
        "model_type": "diffusion_cond",
        "model": {"pretransform": {"type": "autoencoder", "config": {
            "downsampling_ratio": math.prod(strides),
            "encoder": {"type": "oobleck", "config": {"channels": channels}},
            "decoder": {"type": "oobleck", "config": {
                "channels": channels, "c_mults": multiples, "strides": strides,
                "latent_dim": 64, "out_channels": 2, "use_nearest_upsample": False, "final_tanh": False,
            }},
        }}},
    }
    (folder / "model_config.json").write_text(json.dumps(model_config, indent=2), encoding="utf-8")
    decoder = AutoencoderOobleck(
        encoder_hidden_size=channels, downsampling_ratios=strides, channel_multiples=multiples,
        decoder_channels=channels, decoder_input_channels=64, audio_channels=2, sampling_rate=44100,
    ).decoder
    state = {}
    seeded = _seeded_state(decoder, generator)
    # Random Snake/conv stacks amplify by ~200x; scale the output conv so PCM stays in [-1, 1].
    seeded["conv2.weight_g"] = seeded["conv2.weight_g"] * 0.004
    for key, value in seeded.items():
        released = stable_audio_key(key)
        if convert_stable_audio_decoder_key(released) != key:
            raise RuntimeError(f"Stable Audio key mapping drifted from upstream for {key}")
        state[released] = value.reshape(-1) if key.endswith((".alpha", ".beta")) else value
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
