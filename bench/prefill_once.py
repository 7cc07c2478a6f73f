"""Causal prefill of one T-token prompt on the default attention route, launched a few times with
nothing else in the process's GPU work: the program ncu profiles one launch of.

    ncu --clock-control none -k regex:attn_wgmma --launch-skip 3 --launch-count 1 --metrics ... \\
        python3 bench/prefill_once.py [T] [--heads 32,8,128] [--define NAME,...] [--set NAME=VALUE ...]

--define compiles cuda_src with -DNAME=1 (e.g. ATTN_WGMMA_MATH_ONLY, the math without the copies);
--set gives a glimmer_cupy.ops.attention value for the run (e.g. WGMMA_PERSISTENT=False: a block an
item). The inputs are bench_attention.py's (scattered cells, Qwen3-8B heads by default).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import glimmer_cupy.kernels.build as build  # noqa: E402

attention = importlib.import_module("glimmer_cupy.ops.attention")   # the module (ops.attention is the op)


def parse_set(text: str) -> tuple[str, object]:
    """'NAME=VALUE' -> (NAME, the Python literal VALUE), NAME a value of ops.attention."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep:
        raise ValueError(f"--set {text!r}: not NAME=VALUE")
    if not hasattr(attention, name):
        raise ValueError(f"--set {text!r}: glimmer_cupy.ops.attention has no {name!r}")
    try:
        return name, ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
        raise ValueError(f"--set {text!r}: {value.strip()!r} is not a Python literal") from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("length", nargs="?", type=int, default=2048, help="prompt tokens T (default 2048)")
    ap.add_argument("--heads", default="32,8,128", metavar="HQ,HKV,D")
    ap.add_argument("--define", default="", help="comma-separated cuda_src switches")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="an ops.attention value")
    ap.add_argument("--launches", type=int, default=5)
    args = ap.parse_args(argv)
    try:
        hq, hkv, d = (int(x) for x in args.heads.split(","))
    except ValueError:
        ap.error(f"--heads: three integers q_heads,kv_heads,head_dim, got {args.heads!r}")
    try:
        values = [parse_set(s) for s in args.set]
    except ValueError as e:
        ap.error(str(e))
    if args.length < 1 or args.launches < 1:
        ap.error(f"T and --launches must be at least 1, got {args.length} and {args.launches}")
    try:
        import cupy
        build.sm_count()
    except (ImportError, build.NoDeviceError) as e:
        ap.error(f"no GPU to run on: {e}")
    for name, value in values:
        setattr(attention, name, value)
    defines = [x.strip() for x in args.define.split(",") if x.strip()]
    if defines:
        build.add_defines(*defines)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_attention import prompt_inputs
    from glimmer_cupy import ops
    q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos, out = prompt_inputs(
        cupy, np.random.default_rng(1), args.length, hq, hkv, d)
    for _ in range(args.launches):
        ops.attention(q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos, d ** -0.5, out=out)
    cupy.cuda.Device().synchronize()
    print(f"T={args.length} heads {hq}/{hkv}/{d}, {args.launches} launches, defines {defines or 'none'}, "
          f"output finite: {bool(cupy.isfinite(out).all())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
