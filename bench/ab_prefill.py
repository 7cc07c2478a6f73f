"""Causal prefill on the default attention route against variants of it and PyTorch's SDPA,
alternated in one process, so that each comparison sees the card in the same state (a warm card
runs the prefill kernel several per cent slower than a cold one: bench/results/NOTES.md, the
forty-fifth session).

An arm is NAME:DEFINES:ATTRS:KWARGS, each field comma-separated, the last three optional:
  DEFINES  cuda_src switches the arm's kernels are compiled with (-DNAME=1), e.g.
           ATTN_WGMMA_COPY_ONLY (the tile loop's copies alone; wrong results);
  ATTRS    glimmer_cupy.ops.attention module values for the arm, e.g. WGMMA_PERSISTENT=False;
  KWARGS   ops.attention's keyword arguments, e.g. force_rows=128,force_producer=False.
Each round times every arm, then SDPA (flash, bf16, contiguous copies of the same K/V); printed:
each timing with the arm's NMSE against SDPA, then the medians and their ratio to SDPA's.

    PYTHONPATH=$PWD python3 bench/ab_prefill.py --arms "main;copy:ATTN_WGMMA_COPY_ONLY" \\
        --lengths 2048,8192 [--heads 32,8,128] [--rounds 3] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import glimmer_cupy.kernels.build as build  # noqa: E402
from bench_attention import nmse, prompt_inputs, sdpa_prefill  # noqa: E402
from glimmer_cupy import ops  # noqa: E402
from glimmer_cupy.benchmarks.timing import run_meta, time_us  # noqa: E402

attention = importlib.import_module("glimmer_cupy.ops.attention")   # the module (ops.attention is the op)


def parse_arm(text: str) -> tuple[str, list[str], dict, dict]:
    """'name:DEF1,DEF2:attr=value:kw=value' -> (name, defines, attrs, kwargs); values are Python literals."""
    name, defines, attrs, kwargs = (text.split(":") + ["", "", ""])[:4]

    def pairs(field: str) -> dict:
        out = {}
        for item in filter(None, field.split(",")):
            key, sep, value = item.partition("=")
            if not sep:
                raise SystemExit(f"ab_prefill: arm {name!r}: {item!r} is not KEY=VALUE")
            out[key.strip()] = ast.literal_eval(value.strip())
        return out

    attrs_d = pairs(attrs)
    for key in attrs_d:
        if not hasattr(attention, key):
            raise SystemExit(f"ab_prefill: arm {name!r}: ops.attention has no {key!r}")
    return name.strip(), [d.strip() for d in defines.split(",") if d.strip()], attrs_d, pairs(kwargs)


def compiled_alone(wgmma_kernel):
    """ops.attention's _wgmma_kernel (unwrapped) building a module of the one variant asked for
    rather than of every variant (WGMMA_VARIANTS): each arm's defines cost a compile on the device,
    and one variant compiles in a fraction of the time. Each instantiation compiles apart, so its
    code is the same either way."""
    def one(d, stages, rows, producer=False):
        every = attention._WGMMA_EXPRS
        attention._WGMMA_EXPRS = (attention.wgmma_expr(d, stages, rows, producer),)
        try:
            return wgmma_kernel(d, stages, rows, producer)
        finally:
            attention._WGMMA_EXPRS = every
    return one


def key_kernels_by_defines() -> None:
    """The build layer and ops.attention cache compiled modules and kernel functions by their own
    arguments only; key them by the process-wide defines too, so that each arm gets its own build
    (of the variants it runs only: compiled_alone)."""
    extra = lambda: tuple(build._EXTRA_DEFINES)                     # noqa: E731
    load, kernel = build._load.__wrapped__, build._kernel.__wrapped__
    wgmma = compiled_alone(attention._wgmma_kernel.__wrapped__)
    load_k = functools.cache(lambda ex, *a: load(*a))
    kernel_k = functools.cache(lambda ex, *a: kernel(*a))
    wgmma_k = functools.cache(lambda ex, *a: wgmma(*a))
    build._load = lambda *a: load_k(extra(), *a)
    build._kernel = lambda *a: kernel_k(extra(), *a)
    attention._wgmma_kernel = lambda *a: wgmma_k(extra(), *a)


def main(argv=None) -> int:
    import cupy
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", default="main", help="';'-separated arms (above); 'main' alone is the default route")
    ap.add_argument("--lengths", default="2048")
    ap.add_argument("--heads", default="32,8,128", metavar="HQ,HKV,D")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--launches", type=int, default=200)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", help="JSON of every timing")
    args = ap.parse_args(argv)
    arms = [parse_arm(a) for a in args.arms.split(";") if a.strip()]
    hq, hkv, d = (int(x) for x in args.heads.split(","))
    import torch

    key_kernels_by_defines()
    rng = np.random.default_rng(1)
    meta = run_meta(heads=[hq, hkv, d], arms=args.arms, launches=args.launches, reps=args.reps)
    print(f"# {meta['gpu']}, commit {meta['commit']}, heads {hq}/{hkv}/{d}", flush=True)
    rows = []
    for t in (int(x) for x in args.lengths.split(",")):
        q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos, out = prompt_inputs(cupy, rng, t, hq, hkv, d)
        scale = d ** -0.5
        sdpa, ref = sdpa_prefill(torch, cupy, q, k_pool, v_pool, table, scale)
        times = {name: [] for name, *_ in arms} | {"sdpa": []}
        errors = {}
        for r in range(args.rounds):
            for name, defines, attrs, kwargs in arms:
                build._EXTRA_DEFINES[:] = [(x, 1) for x in defines]
                saved = {k: getattr(attention, k) for k in attrs}
                try:
                    for k, v in attrs.items():
                        setattr(attention, k, v)
                    run = lambda i, kw=kwargs: ops.attention(q, k_pool, v_pool, table, seq_lens, tok_seq,  # noqa: E731
                                                             tok_pos, scale, out=out, **kw)
                    out.fill(np.nan)
                    run(0)
                    errors[name] = float(nmse(cupy, out, ref))
                    times[name].append(time_us(run, 1, args.launches, args.reps)[0])
                finally:
                    for k, v in saved.items():
                        setattr(attention, k, v)
                    build._EXTRA_DEFINES[:] = []
                print(f"T={t} round {r} {name}: {times[name][-1]:.1f} us, NMSE vs SDPA {errors[name]:.1e}", flush=True)
            times["sdpa"].append(time_us(sdpa, 1, args.launches, args.reps)[0])
            print(f"T={t} round {r} sdpa: {times['sdpa'][-1]:.1f} us", flush=True)
        base = float(np.median(times["sdpa"]))
        row = {"T": t, "times_us": times, "nmse_vs_sdpa": errors,
               "median_us": {n: float(np.median(v)) for n, v in times.items()}}
        rows.append(row)
        print(f"== T={t}: " + " | ".join(f"{n} {m:.1f} us ({m / base:.3f}x)" for n, m in row["median_us"].items()),
              flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
