"""Matrix products whose every row is the same whatever the row count, on any CPU.

A layout changes the row counts of the DiT's products: one process packs both CFG branches in
one sequence, CFG2 gives each rank one, SP splits the tokens, and the MoE experts get the rows
routed to them. BLAS (MKL here) picks kernels, blocking and thread splits by shape and by the
CPU's instruction set, so a row's fp32 sum, and even its fp64 sum, runs in another order when
the row count changes (measured on an AVX-512 Xeon: fp64 ``[m,64]x[64,4x8]`` differs for m <= 3,
and with ``MKL_ENABLE_INSTRUCTIONS=AVX2`` even a fixed-shape tile gives a row other bits at
another position in the tile). Fixing the order is not in our hands; making it not matter is.

Each fp32 operand is split, per row of the left and per column of the right operand (the
contraction's other side), into two integer slices of ``beta`` bits under a power-of-two scale
(the Ozaki scheme). A product of two slices sums at most K integers below ``2**(2*beta)``,
with ``2*beta + log2(K) <= 53``: every partial sum is an integer that fp64 holds exactly, so
the fp64 product BLAS returns is exact whatever order, blocking or kernel it used. The three
significant slice products are then combined element by element in a fixed order and rounded
to fp32. A row's result therefore depends only on that row and the other operand: not on the
row count, the tile, the thread count or the instruction set. The dropped ``lo x lo`` term and
the bits below ``2*beta`` of a row's largest element are below 2**-40 of it, far under fp32's
own rounding.
"""

from __future__ import annotations

import math
import re
import string

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

FP64_MANTISSA_BITS = 53
SHORT_CONTRACTION = 16

# ``a @ b`` reaches __torch_function__ as TensorBase.matmul, not Tensor.__matmul__.
MATMULS = frozenset({torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm, torch.Tensor.mm,
                     torch.bmm, torch.Tensor.bmm})
_EINSUM_TWO_OPERANDS = re.compile(r"^([a-zA-Z.]+),([a-zA-Z.]+)->([a-zA-Z.]*)$")


def slice_bits(contraction: int) -> int:
    """Bits per slice so that a sum of ``contraction`` slice products is exact in fp64."""

    return (FP64_MANTISSA_BITS - math.ceil(math.log2(max(contraction, 2)))) // 2


def split(tensor: torch.Tensor, dims: tuple[int, ...], beta: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``tensor ~= (hi + lo * 2**-beta) * scale``: integer slices below 2**beta, a power-of-two scale.

    The scale is taken over ``dims`` (the contracted dimensions), so it is one number per row
    of the left operand or per column of the right one: no other row can change it.
    """

    wide = tensor.double()
    largest = wide.abs().amax(dim=dims, keepdim=True) if dims else wide.abs()
    _, exponent = torch.frexp(largest)  # largest < 2**exponent (0 for an all-zero row)
    scale = torch.ldexp(torch.ones_like(largest), exponent - beta)
    scaled = wide / scale  # a power of two: exact
    hi = scaled.trunc()
    lo = ((scaled - hi) * 2.0**beta).trunc()
    return hi, lo, scale


def exact_product(product, a: torch.Tensor, b: torch.Tensor, a_dims: tuple[int, ...], b_dims: tuple[int, ...],
                  contraction: int, paired: bool = True) -> torch.Tensor:
    """``product(a, b)`` from exact fp64 slice products, rounded once to fp32.

    A short contraction (one summed dimension, ``paired``: the same index in both operands, of
    at most :data:`SHORT_CONTRACTION`) is summed
    instead as exact fp64 products of one term each, added in index order: cheaper, as exact
    an order, and the mHC's per-token 4-stream contractions are all of that kind.
    """

    if not a_dims and not b_dims:  # nothing summed: fp64 holds an fp32 x fp32 product exactly
        return product(a.double(), b.double()).float()
    if paired and len(a_dims) == len(b_dims) == 1 and contraction <= SHORT_CONTRACTION:
        total = None
        for index in range(contraction):
            term = product(a.double().narrow(a_dims[0], index, 1), b.double().narrow(b_dims[0], index, 1))
            total = term if total is None else total + term
        return total.float()
    beta = slice_bits(contraction)
    a_hi, a_lo, a_scale = split(a, a_dims, beta)
    b_hi, b_lo, b_scale = split(b, b_dims, beta)
    high = product(a_hi, b_hi)
    cross = product(a_hi, b_lo) + product(a_lo, b_hi)
    scale = product(a_scale, b_scale)  # contracted dims of size 1: the two scales' product, exact
    return ((high + cross * 2.0**-beta) * scale).float()


def _explicit(equation: str, a: torch.Tensor, b: torch.Tensor) -> tuple[str, str, str]:
    """The two operands' and the output's subscripts, ``...`` written out as letters."""

    match = _EINSUM_TWO_OPERANDS.match(equation.replace(" ", ""))
    if match is None:
        raise NotImplementedError(f"layout-invariant products: einsum {equation!r} is not 'A,B->C' "
                                  "(two operands, an explicit output)")
    left, right, out = match.groups()
    free = [letter for letter in string.ascii_letters if letter not in equation]
    spans = [t.ndim - len(sub.replace("...", "")) for sub, t in ((left, a), (right, b)) if "..." in sub]
    ellipsis = free[:max(spans, default=0)]
    left, right = (sub.replace("...", "".join(ellipsis[len(ellipsis) - (t.ndim - len(sub) + 3):]))
                   for sub, t in ((left, a), (right, b)))
    return left, right, out.replace("...", "".join(ellipsis))


def _einsum_sides(equation: str, a: torch.Tensor, b: torch.Tensor):
    left, right, out = _explicit(equation, a, b)
    summed = [letter for letter in dict.fromkeys(left + right) if letter not in out]
    a_dims = tuple(i for i, letter in enumerate(left) if letter in summed)
    b_dims = tuple(i for i, letter in enumerate(right) if letter in summed)
    sizes = {**dict(zip(right, b.shape)), **dict(zip(left, a.shape))}
    paired = all(letter in left and letter in right for letter in summed)
    return a_dims, b_dims, math.prod(sizes[letter] for letter in summed), paired


class LayoutInvariantProducts(TorchFunctionMode):
    """fp32 ``F.linear``, matmul (``@``, mm, bmm) and two-operand einsum as :func:`exact_product`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "out" not in kwargs:
            if func is F.linear:
                x, weight = args[0], args[1]
                bias = args[2] if len(args) > 2 else kwargs.get("bias")
                if _all_fp32(x, weight, bias):
                    y = exact_product(F.linear, x, weight, (-1,), (-1,), x.shape[-1])
                    return y if bias is None else (y.double() + bias.double()).float()
            elif func in MATMULS and len(args) == 2 and not kwargs:
                a, b = args
                if _all_fp32(a, b) and a.ndim >= 2 and b.ndim >= 2:
                    return exact_product(func, a, b, (-1,), (-2,), a.shape[-1])
            elif func is torch.einsum and len(args) == 3 and isinstance(args[0], str) and not kwargs:
                equation, a, b = args
                if _all_fp32(a, b):
                    a_dims, b_dims, contraction, paired = _einsum_sides(equation, a, b)
                    return exact_product(lambda p, q: torch.einsum(equation, p, q), a, b, a_dims, b_dims,
                                         contraction, paired)
        return func(*args, **kwargs)


def _all_fp32(*values) -> bool:
    tensors = [v for v in values if v is not None]
    return all(isinstance(t, torch.Tensor) and t.dtype == torch.float32 for t in tensors)
