"""A test checkpoint for the real pipeline: MAGI-2 Preview at its real widths, fewer layers, random weights.

No released weights exist where the real path is checked, so ``scripts/make-test-checkpoint``
writes seeded random weights in the released folder layout (the files upstream's
``_REQUIRED_CHECKPOINT_PATHS`` names, plus a ``SHA256SUMS`` that ``weights check`` compares).
Widths are the released ones (hidden 3072, head dim 128, 24 query groups, 12 MoE heads x 256
experts top-6, mHC 4 streams; Qwen3.5-27B's widths for the text encoder; Wan2.2's VAE as
upstream hard-codes it; Stable Audio Open 1.0's Oobleck decoder). Depth is reduced: the DiT keeps
every kind of block (two dense multimodal layers at each end, MoE layers between), the text
encoder three linear-attention layers and one full-attention layer (its own ``config.json``).

Upstream hard-codes the DiT's depth (``MAGI2_PREVIEW_CONFIG.num_layers = 40``). The one
test-only switch is ``MAGI2STUDIO_TEST_CHECKPOINT`` (the checkpoint root): the worker plugin
calls :func:`apply_from_env` in every worker, which refuses unless that root carries
``magi2studio-test-checkpoint.json`` with ``"test_checkpoint": true``, then replaces upstream's
module-level config by the marker's depth. Unset (the default everywhere), nothing changes.
The vllm-omni engine sets it only for a marked tree and records the marker in every manifest.

Over 300 lines on purpose: the marker, the switch that checks it and the writer of each part of the
tree must agree on one spec; in one module a change to the spec shows in all three.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

MARKER_FILE = "magi2studio-test-checkpoint.json"
ENV_TEST_CHECKPOINT = "MAGI2STUDIO_TEST_CHECKPOINT"
SHA256SUMS = "SHA256SUMS"
_MAGI2_PACKAGE = "vllm_omni.diffusion.models.magi2"
# Qwen3.5-27B's published widths (hidden 5120 is MAGI-2's text_in_channels).
QWEN35_27B = {"vocab_size": 248320, "hidden_size": 5120, "intermediate_size": 17408, "num_attention_heads": 24,
              "num_key_value_heads": 4, "head_dim": 256, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
              "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_conv_kernel_dim": 4}
# Stable Audio Open 1.0's autoencoder decoder (its model_config.json: 2048x down, 64 latent channels).
STABLE_AUDIO_DECODER = {"channels": 128, "c_mults": [1, 2, 4, 8, 16], "strides": [2, 4, 4, 8, 8], "latent_dim": 64,
                        "out_channels": 2, "use_nearest_upsample": False, "final_tanh": False}
# TurboVAE's released config is not public here: a stand-in with its interface (48 latent channels,
# 16x spatial = 8x compression with patch 2), named in the marker's stand_ins.
TURBO_STAND_IN = {"latent_channels": 48, "out_channels": 3, "first_chunk_size": 1, "step_size": 4,
                  "temporal_compression_ratio": 4, "spatial_compression_ratio": 8,
                  "decoder_block_out_channels": [256, 128, 64], "decoder_layers_per_block": [2, 2, 2, 2],
                  "decoder_spatio_temporal_scaling": [True, True, True], "decoder_spatio_only": [False, False, True],
                  "patch_size": 2, "decoder_causal": False, "use_unpatchify": True, "decoder_is_dw_conv": []}


class TestCheckpointError(RuntimeError):
    """The test-only depth switch was asked for a tree that does not mark itself a test checkpoint."""

    __test__ = False  # not a pytest class


@dataclass(frozen=True)
class TestCheckpointSpec:
    """The reduced depths (widths stay the released ones) and the seed."""

    __test__ = False  # not a pytest class
    seed: int = 0
    num_layers: int = 6
    multimodal_layers: tuple[int, ...] = (0, 1, 4, 5)  # released: 0, 1, 38, 39
    moe_layers: tuple[int, ...] = (2, 3)  # released: 2..37
    text_layers: int = 4  # three linear-attention layers, then one full-attention layer (Qwen3.5's pattern)

    def __post_init__(self) -> None:
        layers = set(range(self.num_layers))
        ends = {0, 1, self.num_layers - 2, self.num_layers - 1}
        if set(self.multimodal_layers) != ends:
            raise ValueError(f"multimodal_layers must be the first two and last two layers: {sorted(ends)}")
        if set(self.moe_layers) != layers - ends or len(self.moe_layers) < 2:
            raise ValueError("moe_layers must be every layer between the ends, at least two")
        if self.text_layers < 1:
            raise ValueError("text_layers must be at least 1")

    def preview_config(self):
        """Upstream's released config with only the depth changed."""

        from vllm_omni.diffusion.models.magi2.configuration_magi2 import Magi2PreviewConfig

        released = Magi2PreviewConfig()
        return replace(released, num_layers=self.num_layers, multimodal_layers=tuple(self.multimodal_layers),
                       moe=replace(released.moe, layers=tuple(self.moe_layers)))

    def marker(self) -> dict[str, Any]:
        return {"test_checkpoint": True, "random_weights": True, "spec": asdict(self),
                "stand_ins": {"turbo_vae": "TurboVAE's released config is not public: decoder widths "
                              + json.dumps(TURBO_STAND_IN["decoder_block_out_channels"]),
                              "tokenizer": "byte-level BPE trained on magi2studio's corpus (Qwen3.5's tokenizer "
                              "files are not shipped); the embedding keeps Qwen3.5's 248320 rows"}}


def read_marker(root: str | os.PathLike) -> dict[str, Any] | None:
    """The tree's test-checkpoint marker, or None for a tree that is not one."""

    path = Path(root) / MARKER_FILE
    if not path.is_file():
        return None
    marker = json.loads(path.read_text(encoding="utf-8"))
    return marker if marker.get("test_checkpoint") is True else None


def worker_env(root: str | os.PathLike) -> dict[str, str]:
    """The workers' env for a checkpoint root: the depth switch for a marked test tree, nothing otherwise."""

    return {ENV_TEST_CHECKPOINT: str(root)} if read_marker(root) is not None else {}


def sums_digest(root: str | os.PathLike) -> str | None:
    """sha256 of the tree's ``SHA256SUMS`` (one digest naming every file's), or None without one."""

    path = Path(root) / SHA256SUMS
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def apply_from_env(environ=os.environ) -> dict[str, Any] | None:
    """The test-only depth switch, run by the worker plugin in every worker; None when unset."""

    root = environ.get(ENV_TEST_CHECKPOINT, "").strip()
    if not root:
        return None
    marker = read_marker(root)
    if marker is None:
        raise TestCheckpointError(
            f"{ENV_TEST_CHECKPOINT}: {root} has no {MARKER_FILE} marking it a test checkpoint; the reduced depth is "
            f"only for trees scripts/make-test-checkpoint wrote. Fix: unset {ENV_TEST_CHECKPOINT} for real weights")
    spec = TestCheckpointSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in marker["spec"].items()})
    install_depth(spec)
    return {"root": str(root), **marker}


def install_depth(spec: TestCheckpointSpec) -> None:
    """Replace upstream's module-level ``MAGI2_PREVIEW_CONFIG`` (and every magi2 module's copy of the name)."""

    import importlib

    config = importlib.import_module(f"{_MAGI2_PACKAGE}.configuration_magi2")
    reduced = spec.preview_config()
    reduced.validate()
    for name, module in list(sys.modules.items()):
        if name.startswith(_MAGI2_PACKAGE) and getattr(module, "MAGI2_PREVIEW_CONFIG", None) is not None:
            module.MAGI2_PREVIEW_CONFIG = reduced
    config.MAGI2_PREVIEW_CONFIG = reduced


# ---- writing the tree -------------------------------------------------------------------------


class _Writer:
    """Seeded tensors (drawn on ``device``), each file's sha256 recorded as it is written."""

    def __init__(self, root: Path, seed: int, device: str) -> None:
        import torch

        self.root, self.device = root, device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.sums: dict[str, str] = {}

    def tensor(self, name: str, shape: tuple[int, ...], dtype):
        import torch

        if dtype in (torch.int32, torch.int64, torch.bool):
            return torch.zeros(shape, dtype=dtype)
        values = torch.randn(shape, generator=self.generator, device=self.device, dtype=torch.float32)
        if len(shape) >= 2:
            values /= math.sqrt(math.prod(shape[1:]))
        elif "norm" in name or name.endswith((".weight", "_g", ".alpha", ".beta")):
            values = 1.0 + 0.02 * values
        else:
            values *= 0.02
        return values.to(dtype).cpu()

    def state(self, module, dtype=None, rename=lambda k: k) -> dict:
        return {rename(k): self.tensor(k, tuple(t.shape), dtype or t.dtype).contiguous()
                for k, t in module.state_dict().items()}

    def record(self, path: Path) -> None:
        digest = hashlib.sha256()
        with open(path, "rb") as file:
            while chunk := file.read(1 << 24):
                digest.update(chunk)
        self.sums[path.relative_to(self.root).as_posix()] = digest.hexdigest()

    def write_text(self, relative: str, text: str) -> None:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        self.record(path)

    def safetensors_shards(self, folder: str, states: list[dict], prefix: str = "model") -> None:
        """States as numbered safetensors shards plus ``model.safetensors.index.json`` (the released layout)."""

        from safetensors.torch import save_file

        (self.root / folder).mkdir(parents=True, exist_ok=True)
        weight_map, total = {}, 0
        for number, state in enumerate(states, 1):
            shard = f"{prefix}-{number:05d}-of-{len(states):05d}.safetensors"
            save_file(state, str(self.root / folder / shard), metadata={"format": "pt"})
            self.record(self.root / folder / shard)
            for name, tensor in state.items():
                weight_map[name] = shard
                total += tensor.numel() * tensor.element_size()
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        self.write_text(f"{folder}/{prefix}.safetensors.index.json", json.dumps(index, indent=2))


def write_test_checkpoint(root: str | os.PathLike, spec: TestCheckpointSpec = TestCheckpointSpec(),
                          device: str = "cpu") -> Path:
    """Write the whole tree into ``root`` (must not exist); returns it. The marker is written last."""

    import torch

    root = Path(root)
    root.mkdir(parents=True)
    writer = _Writer(root, spec.seed, device)
    _write_preview(writer, spec)
    _write_text_encoder(writer, spec)
    from vllm_omni.diffusion.models.lance.wan_vae import WanVAE_

    with torch.device("meta"):
        wan = WanVAE_(dim=160, dec_dim=256, z_dim=48, dim_mult=(1, 2, 4, 4), num_res_blocks=2, attn_scales=(),
                      temperal_downsample=(False, True, True), dropout=0.0)  # LanceWanVAE's own arguments
    (root / "vae").mkdir()
    torch.save(writer.state(wan, torch.float32), root / "vae" / "Wan2.2_VAE.pth")
    writer.record(root / "vae" / "Wan2.2_VAE.pth")
    _write_turbo_vae(writer)
    _write_audio_decoder(writer)
    writer.write_text(MARKER_FILE, json.dumps(spec.marker(), indent=2))
    sums = "".join(f"{digest}  {name}\n" for name, digest in sorted(writer.sums.items()))
    (root / SHA256SUMS).write_text(sums, encoding="utf-8")
    return root


def _write_preview(writer: _Writer, spec: TestCheckpointSpec) -> None:
    import torch
    from vllm_omni.diffusion.models.magi2.modeling_magi2 import Magi2PreviewTransformer

    with torch.device("meta"):
        model = Magi2PreviewTransformer(spec.preview_config())
    shapes = model.state_dict()
    # One shard per layer (a MoE layer is ~6 GB in bf16), the adapters with the first.
    groups: dict[str, list[str]] = {}
    for name in shapes:
        key = ".".join(name.split(".")[:3]) if name.startswith("block.layers.") else "adapters"
        groups.setdefault(key, []).append(name)
    states = [{n: writer.tensor(n, tuple(shapes[n].shape), shapes[n].dtype).contiguous() for n in names}
              for names in groups.values()]
    writer.safetensors_shards("preview", states)
    writer.write_text("preview/config.json", json.dumps({"magi2studio_test_checkpoint": asdict(spec)}))


def _write_text_encoder(writer: _Writer, spec: TestCheckpointSpec) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3_5TextConfig, Qwen3_5TextModel

    folder = writer.root / "text_encoder"
    folder.mkdir()
    from .embedded.checkpoint import TOKENIZER_CORPUS as corpus  # a small BPE tokenizer, trained as the tiny tree's
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4096, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train([str(corpus)], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.save_pretrained(str(folder))
    for path in sorted(folder.iterdir()):
        writer.record(path)
    pattern = ["linear_attention"] * 3 + ["full_attention"]
    config = Qwen3_5TextConfig(**QWEN35_27B, num_hidden_layers=spec.text_layers,
                               layer_types=(pattern * spec.text_layers)[: spec.text_layers],
                               max_position_embeddings=262144)
    config.architectures = ["Qwen3_5TextModel"]
    config.save_pretrained(str(folder))
    writer.record(folder / "config.json")
    with torch.device("meta"):
        model = Qwen3_5TextModel(config)
    shapes = model.state_dict()
    embed = [n for n in shapes if "embed" in n]
    rest = [n for n in shapes if n not in embed]
    states = [{n: writer.tensor(n, tuple(shapes[n].shape), torch.bfloat16).contiguous() for n in names}
              for names in (embed, rest)]
    writer.safetensors_shards("text_encoder", states)


def _write_turbo_vae(writer: _Writer) -> None:
    import torch

    from .embedded.checkpoint import turbo_decoder

    spec = TURBO_STAND_IN
    writer.write_text("turbo_vae/TurboV3-Wan22-TinyShallow_7_7.json", json.dumps(spec, indent=2))
    with torch.device("meta"):
        decoder = turbo_decoder(spec)
    state = writer.state(decoder, torch.float32, rename=lambda k: f"module.decoder.{k}")
    torch.save({"ema_state_dict": state}, writer.root / "turbo_vae" / "checkpoint.ckpt")
    writer.record(writer.root / "turbo_vae" / "checkpoint.ckpt")


def _write_audio_decoder(writer: _Writer) -> None:
    import torch
    from diffusers import AutoencoderOobleck
    from safetensors.torch import save_file
    from vllm_omni.diffusion.models.magi2.audio_decoder import convert_stable_audio_decoder_key

    from .embedded.checkpoint import stable_audio_key

    decoder_config = STABLE_AUDIO_DECODER
    model_config = {"sample_rate": 44100, "model_type": "diffusion_cond", "model": {"pretransform": {
        "type": "autoencoder", "config": {
            "downsampling_ratio": math.prod(decoder_config["strides"]),
            "encoder": {"type": "oobleck", "config": {"channels": decoder_config["channels"]}},
            "decoder": {"type": "oobleck", "config": decoder_config}}}}}
    writer.write_text("stable-audio-open-1.0/model_config.json", json.dumps(model_config, indent=2))
    with torch.device("meta"):
        decoder = AutoencoderOobleck(
            encoder_hidden_size=decoder_config["channels"], downsampling_ratios=decoder_config["strides"],
            channel_multiples=decoder_config["c_mults"], decoder_channels=decoder_config["channels"],
            decoder_input_channels=64, audio_channels=2, sampling_rate=44100).decoder
    state = {}
    seeded = writer.state(decoder, torch.float32)
    # Random Snake/conv stacks amplify by ~200x; scale the output conv so PCM stays near [-1, 1].
    seeded["conv2.weight_g"] = seeded["conv2.weight_g"] * 0.004
    for key, value in seeded.items():
        released = stable_audio_key(key)
        if convert_stable_audio_decoder_key(released) != key:
            raise RuntimeError(f"Stable Audio key mapping drifted from upstream for {key}")
        state[released] = value.reshape(-1) if key.endswith((".alpha", ".beta")) else value
    path = writer.root / "stable-audio-open-1.0" / "model.safetensors"
    save_file(state, str(path), metadata={"format": "pt"})
    writer.record(path)
