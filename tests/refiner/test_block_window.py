"""Block-window attention equals dense attention under the explicit mask it claims to apply."""

import json
from pathlib import Path

import pytest
import torch

from magi2studio.engines.embedded.block_window import (
    BlockWindow,
    WindowLayout,
    block_window_attention,
    masked_dense_attention,
    reference_mask,
)

SANDAI = Path(__file__).resolve().parents[2] / "magi2studio" / "data" / "sandai" / "magi2_refiner.json"


def packed(t, h, w, texts, audio=6, ref_image=None):
    """Coordinates, modalities and cu_seqlens from upstream's own data proxy (CFG-style batch)."""

    from vllm_omni.diffusion.models.magi2.preview_data_proxy import Magi2DataProxy, ModelInput

    batch = len(texts)
    extra = {}
    if ref_image is not None:
        rh, rw = ref_image
        extra = dict(ref_image_feat=torch.randn(batch, 1, 48, 1, rh, rw),
                     ref_image_feat_len=torch.tensor([[[rh, rw]]] * batch),
                     ref_image_special_token_embedding=torch.randn(batch, 1, 16))
    data = ModelInput(x_t=torch.randn(batch, 48, t, h, w), audio_x_t=torch.randn(batch, audio, 64),
                      audio_feat_len=[audio] * batch, txt_feat=torch.randn(batch, max(texts), 16),
                      txt_feat_len=list(texts), t=torch.zeros(batch),
                      per_token_video_t=torch.zeros(batch, 1, t, h, w), per_token_audio_t=torch.zeros(batch, audio, 1),
                      **extra)
    out = Magi2DataProxy().process_input(data)
    return out.coords_mapping, out.modality_mapping, out.varlen_handler.cu_seqlens_q


CASES = [
    # (t, h, w), window, texts, ref image: partial edge blocks in every axis, two CFG samples
    ((7, 17, 30), BlockWindow(2, 4, 4, 2, 2, 2), (9, 5), None),
    ((5, 9, 11), BlockWindow(2, 3, 4, 1, 1, 1), (4,), (3, 4)),
    ((9, 20, 6), BlockWindow(8, 4, 4, 2, 2, 2), (3, 3), None),  # Sand AI's own block sizes
]


@pytest.mark.parametrize("grid,window,texts,ref_image", CASES)
def test_block_window_equals_masked_dense_attention(grid, window, texts, ref_image):
    coords, modality, cu = packed(*grid, texts, ref_image=ref_image)
    n = coords.shape[0]
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(n, 8, 16, generator=generator)
    k = torch.randn(n, 2, 16, generator=generator)  # GQA 4:1
    v = torch.randn(n, 2, 16, generator=generator)
    sink = torch.randn(1, 8, generator=generator)
    mask = reference_mask(coords, modality, cu, window)
    grid_tokens = grid[0] * grid[1] * grid[2]
    # The mask is a real window: some grid pairs of one sample are masked, no cross-sample pair is kept.
    assert not mask[:grid_tokens, :grid_tokens].all()
    assert not mask[: int(cu[1]), int(cu[1]):].any()
    expected = masked_dense_attention(q, k, v, mask, sink)
    layout = WindowLayout.build(coords, modality, cu, window)
    actual = block_window_attention(q, k, v, layout, sink)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    # ... and it is not full attention within each sample: that result differs.
    sample = torch.bucketize(torch.arange(n), cu[1:].long(), right=True)
    full = masked_dense_attention(q, k, v, sample[:, None] == sample[None, :], sink)
    assert not torch.allclose(full, expected, atol=1e-4)


def test_text_and_audio_are_global_and_the_window_is_per_block():
    window = BlockWindow(2, 4, 4, 1, 1, 1)
    coords, modality, cu = packed(6, 8, 12, (5,))
    mask = reference_mask(coords, modality, cu, window)
    grid = 6 * 8 * 12
    assert mask[:, grid:].all() and mask[grid:, :].all()  # audio and text rows and columns
    index = torch.arange(grid).reshape(6, 8, 12)
    corner, far = int(index[0, 0, 0]), int(index[5, 7, 11])
    assert not mask[corner, far]
    # Tokens of one block share one row of the mask (the window is per block, not per token).
    assert torch.equal(mask[int(index[0, 0, 0])], mask[int(index[1, 3, 3])])
    assert mask[int(index[0, 0, 0]), int(index[3, 7, 7])] and not mask[int(index[0, 0, 0]), int(index[4, 0, 0])]


def test_sandai_attn_config_reads_as_the_default_window():
    config = json.loads(SANDAI.read_text())["evaluation_config"]["magi2_refiner_data_proxy_config"]["attn_config"]
    assert BlockWindow.from_sandai(config) == BlockWindow(8, 4, 4, 2, 2, 2)
    with pytest.raises(ValueError):
        BlockWindow.from_sandai({**config, "window": {**config["window"], "level": "token"}})
