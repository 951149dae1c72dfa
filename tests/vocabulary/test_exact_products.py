"""Layout-invariant products: a row's result does not depend on the row count or its place, on any ISA."""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from magi2studio.engines.embedded.exact_products import LayoutInvariantProducts, slice_bits

# The DiT's product shapes (K, N) at the tiny config: projections, MoE experts, the mHC
# [tokens, 4C] x [4C, 24] projection, the adapters.
SHAPES = ((256, 768), (64, 64), (1024, 24), (48, 1024), (640, 256), (256, 8))
ROW_COUNTS = (1, 2, 3, 8, 33, 291)  # odd and even, below and above any tile or panel
SHIFTS = (0, 3)  # the rows' place: other rows before them


def row_differences() -> list[str]:
    """Every (product, shape, row count, shift) whose rows differ from the same rows in a 300-row product."""

    torch.manual_seed(0)
    found = []
    with LayoutInvariantProducts():
        for k, n in SHAPES:
            w = torch.randn(n, k)
            x = torch.randn(300, k) * torch.rand(300, 1) * 10
            products = {"linear": lambda rows, w=w: F.linear(rows, w), "@": lambda rows, w=w: rows @ w.t()}
            for name, product in products.items():
                full = product(x)
                for m in ROW_COUNTS:
                    for shift in SHIFTS:
                        rows = torch.cat((torch.randn(shift, k), x[:m]))
                        if not torch.equal(product(rows)[shift:], full[:m]):
                            found.append(f"{name} K={k} N={n} m={m} shift={shift}")
        tokens, gate = torch.randn(300, 4, 64), torch.randn(4, 8, 64)
        full = torch.einsum("shd,hed->hse", tokens, gate)  # the MoE router: tokens are the free rows
        for m in ROW_COUNTS:
            if not torch.equal(torch.einsum("shd,hed->hse", tokens[:m], gate), full[:, :m]):
                found.append(f"einsum shd,hed->hse m={m}")
        coefficients, streams = torch.randn(300, 4), torch.randn(300, 4, 256)
        full = torch.einsum("tn,tnc->tc", coefficients, streams)  # mHC pre-application: tokens are the batch
        for m in ROW_COUNTS:
            if not torch.equal(torch.einsum("tn,tnc->tc", coefficients[:m], streams[:m]), full[:m]):
                found.append(f"einsum tn,tnc->tc m={m}")
    return found


def test_rows_do_not_depend_on_the_row_count_or_their_place():
    assert row_differences() == []


@pytest.mark.slow
@pytest.mark.parametrize("isa", [
    {},
    {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    {"MKL_CBWR": "COMPATIBLE"},
], ids=["native", "avx2", "mkl-compatible"])
def test_rows_do_not_depend_on_the_row_count_under_another_instruction_set(isa):
    """MKL's AVX2 kernels give a row other bits at another place even in a fixed-shape tile;
    the exact slice products must not care (a fresh process: these are read at start-up)."""

    code = ("import json; from tests.vocabulary.test_exact_products import row_differences; "
            "print(json.dumps(row_differences()))")
    env = {**os.environ, **isa}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_the_result_is_the_product_to_fp32_rounding():
    torch.manual_seed(1)
    x, w = torch.randn(97, 1024), torch.randn(24, 1024)
    exact = x.double() @ w.double().t()
    with LayoutInvariantProducts():
        got = x @ w.t()
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), exact, rtol=2**-23, atol=2**-23 * exact.abs().max().item())


def test_slices_are_exact_in_fp64():
    """2 * beta bits per slice product plus log2(K) bits of summing fit fp64's 53 bits."""

    for k in (1, 2, 64, 1000, 1024, 1025, 1 << 16):
        beta = slice_bits(k)
        assert 2 * beta + (k - 1).bit_length() <= 53 and beta >= 12, (k, beta)


@pytest.mark.parametrize("equation,shapes", [
    ("ij,kl->ik", ((3, 4), (5, 6))),  # a letter summed in one operand only: not a paired contraction
    ("k,bkc...->bc...", ((3,), (2, 3, 5, 4))),  # the scheduler's, with an ellipsis
    ("tn,tnc->tc", ((7, 4), (7, 4, 9))),  # short paired contraction
    ("qhd,khd->hqk", ((5, 2, 32), (6, 2, 32))),
])
def test_einsum_is_the_einsum_to_fp32_rounding(equation, shapes):
    torch.manual_seed(2)
    a, b = (torch.randn(*shape) for shape in shapes)
    exact = torch.einsum(equation, a.double(), b.double())
    with LayoutInvariantProducts():
        got = torch.einsum(equation, a, b)
    assert got.dtype == torch.float32 and got.shape == exact.shape
    assert torch.allclose(got.double(), exact, rtol=2**-22, atol=2**-22 * exact.abs().max().item())
