"""Instruction mix of the Sinkhorn kernel as compiled for sm_90, on a machine without a GPU.

Triton's wheel carries ptxas and nvdisasm, so the kernel compiles for Hopper here and its SASS can be
counted: static instructions per token, by opcode (the loop is fully unrolled: 20 iterations). This is
how issue 31's Sinkhorn rewrite was sized before a device call:

    PYTHONPATH=kernels .venv/bin/python scripts/kernel_sass.py [--block-t 256] [--num-warps 4] [--no-fast-reciprocal]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--block-t", type=int, default=256)
    parser.add_argument("--num-warps", type=int, default=4)
    parser.add_argument("--no-fast-reciprocal", action="store_true")
    args = parser.parse_args(argv)
    if args.block_t < 32 or args.block_t & (args.block_t - 1):
        parser.error(f"--block-t: {args.block_t}; give a power of two of at least 32")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from magi2_kernels import mhc_triton

    names = ["post_ptr", "res_ptr", "alpha_post_ptr", "bias_post_ptr", "alpha_res_ptr", "bias_res_ptr",
             "post_out_ptr", "res_out_ptr", "tokens", "stride_pt", "stride_pn", "stride_rt", "stride_ri",
             "stride_rj", "scale", "epsilon", "ITERATIONS", "BLOCK_T", "FAST_RCP"]
    types = ["*fp32"] * 6 + ["*bf16"] * 2 + ["i32"] * 6 + ["fp32", "fp32"] + ["constexpr"] * 3
    constants = {"ITERATIONS": 20, "BLOCK_T": args.block_t, "FAST_RCP": not args.no_fast_reciprocal,
                 "stride_pn": 1, "stride_rj": 1}
    source = ASTSource(fn=mhc_triton._post_residual_kernel, signature=dict(zip(names, types)), constexprs=constants)
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": args.num_warps})
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        sass = subprocess.run([nvdisasm, "-c", cubin.name], capture_output=True, text=True, check=True).stdout
    opcodes = collections.Counter(
        m.group(1).split(".")[0] for m in re.finditer(r"/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass))
    per_token = args.num_warps * 32 / args.block_t  # every thread runs the whole unrolled body
    print(json.dumps(dict(triton=triton.__version__, block_t=args.block_t, num_warps=args.num_warps,
                          fast_reciprocal=not args.no_fast_reciprocal,
                          instructions_per_token=round(sum(opcodes.values()) * per_token),
                          by_opcode={op: round(n * per_token) for op, n in opcodes.most_common(8)})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
