"""Time the small decoder-layer kernels (norm, rope, activations, embed) on the GPU.

Each op is checked against its NumPy reference once, then captured N times into a CUDA graph
(inputs rotated over several buffer sets so that, where the sizes allow, L2 does not hold the
next launch's input) and timed with CUDA events: median over repeats of graph time / N. The
ceiling is a device-to-device copy moving the same number of bytes (read + written), captured
and timed the same way in the same run. One row per op and size:

    rms_norm  T=64 d=4096 |   3.1 us | 1.35 TB/s (52% of copy, copy 2.6 TB/s at these bytes)

    PYTHONPATH=$PWD python3 bench/bench_elementwise.py [--reps 50] [--launches 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy.benchmarks.timing import device_name, graph_time_us, n_sets  # noqa: E402
from glimmer_cupy import ops  # noqa: E402
from glimmer_cupy.reference import activation as ref_act  # noqa: E402
from glimmer_cupy.reference import matmul as ref_matmul  # noqa: E402
from glimmer_cupy.reference import norm as ref_norm  # noqa: E402
from glimmer_cupy.reference import rope as ref_rope  # noqa: E402
from glimmer_cupy.weights.quant_tensor import QType, QuantTensor, row_bytes  # noqa: E402
from glimmer_cupy.weights.random_blocks import random_blocks  # noqa: E402

# Qwen3-8B-like shapes: hidden 4096, 32 q / 8 kv heads of 128, ffn 12288, vocab 151936
HIDDEN, HEADS, HEAD_DIM, FFN, VOCAB = 4096, 32, 128, 12288, 151936
TOKENS = (1, 64, 2048)


@dataclass
class Case:
    name: str
    size: str
    nbytes: int                                   # bytes the op must read + write
    make: Callable[[np.random.Generator], tuple]  # -> (run(set), check()) over a fresh input set


def copy_time_us(nbytes: int, launches: int, reps: int) -> float:
    """A D2D copy that reads nbytes/2 and writes nbytes/2, rotated like the ops' inputs."""
    import cupy
    half = max(4, nbytes // 2)
    sets = n_sets(nbytes)
    src = [cupy.ones(half, dtype=np.uint8) for _ in range(sets)]
    dst = [cupy.empty(half, dtype=np.uint8) for _ in range(sets)]

    def launch(i):
        dst[i].data.copy_from_device_async(src[i].data, half, cupy.cuda.get_current_stream())
    return graph_time_us(launch, sets, launches, reps)


def nmse(out, ref) -> float:
    import cupy
    out = cupy.asnumpy(out).astype(np.float64)
    return float(np.mean((out - ref) ** 2) / np.mean(np.asarray(ref, np.float64) ** 2))


def cases() -> list[Case]:
    import cupy
    out: list[Case] = []

    def dev(a):
        return cupy.asarray(a)

    for t in TOKENS:
        # rms_norm over the hidden size
        def mk_norm(rng, t=t):
            x = rng.normal(0, 3, (t, HIDDEN)).astype(np.float32)
            w = rng.normal(1, 0.1, HIDDEN).astype(np.float32)
            sets = n_sets(2 * x.nbytes)
            xs, ws, os_ = [dev(x) for _ in range(sets)], dev(w), [cupy.empty_like(dev(x)) for _ in range(sets)]
            return sets, (lambda i: ops.rms_norm(xs[i], ws, 1e-6, out=os_[i])), \
                (lambda: nmse(ops.rms_norm(xs[0], ws, 1e-6), ref_norm.rms_norm(x, w, 1e-6)))
        out.append(Case("rms_norm", f"T={t} d={HIDDEN}", 2 * t * HIDDEN * 4 + HIDDEN * 4, mk_norm))

        def mk_add(rng, t=t):
            r = rng.normal(0, 3, (t, HIDDEN)).astype(np.float32)
            d = rng.normal(0, 1, (t, HIDDEN)).astype(np.float32)
            w = rng.normal(1, 0.1, HIDDEN).astype(np.float32)
            sets = n_sets(4 * r.nbytes)
            rs, ds, os_ = [dev(r) for _ in range(sets)], [dev(d) for _ in range(sets)], [dev(r) for _ in range(sets)]
            ws = dev(w)

            def check():
                rr = dev(r)
                return nmse(ops.add_rms_norm_(rr, dev(d), ws, 1e-6), ref_norm.add_rms_norm_(r.copy(), d, w, 1e-6))
            return sets, (lambda i: ops.add_rms_norm_(rs[i], ds[i], ws, 1e-6, out=os_[i])), check
        out.append(Case("add_rms_norm_", f"T={t} d={HIDDEN}", 4 * t * HIDDEN * 4 + HIDDEN * 4, mk_add))

        def mk_qk(rng, t=t):
            q = rng.normal(0, 2, (t, HEADS, HEAD_DIM)).astype(np.float32)
            w = rng.normal(1, 0.1, HEAD_DIM).astype(np.float32)
            sets = n_sets(2 * q.nbytes)
            qs, ws, os_ = [dev(q) for _ in range(sets)], dev(w), [cupy.empty_like(dev(q)) for _ in range(sets)]
            return sets, (lambda i: ops.rms_norm(qs[i], ws, 1e-6, out=os_[i])), \
                (lambda: nmse(ops.rms_norm(qs[0], ws, 1e-6), ref_norm.rms_norm(q, w, 1e-6)))
        out.append(Case("qk_norm", f"T={t} {HEADS}x{HEAD_DIM}", 2 * t * HEADS * HEAD_DIM * 4, mk_qk))

        def mk_rope(rng, t=t):
            q = rng.normal(0, 1, (t, HEADS, HEAD_DIM)).astype(np.float32)
            pos = rng.integers(0, 32768, t).astype(np.int32)
            sets = n_sets(2 * q.nbytes)
            qs, ps, os_ = [dev(q) for _ in range(sets)], dev(pos), [cupy.empty_like(dev(q)) for _ in range(sets)]
            return sets, (lambda i: ops.rope(qs[i], ps, 1e6, True, out=os_[i])), \
                (lambda: nmse(ops.rope(qs[0], ps, 1e6, True), ref_rope.rope(q, pos, 1e6, True)))
        out.append(Case("rope neox", f"T={t} {HEADS}x{HEAD_DIM}", 2 * t * HEADS * HEAD_DIM * 4 + 4 * t, mk_rope))

        for name, fn, ref in (("silu_mul", ops.silu_mul, ref_act.silu_mul), ("gelu_mul", ops.gelu_mul, ref_act.gelu_mul)):
            def mk_gated(rng, t=t, fn=fn, ref=ref):
                gu = rng.normal(0, 2, (t, 2 * FFN)).astype(np.float32)
                sets = n_sets(gu.nbytes * 3 // 2)
                gs, os_ = [dev(gu) for _ in range(sets)], [cupy.empty((t, FFN), np.float32) for _ in range(sets)]
                return sets, (lambda i: fn(gs[i], out=os_[i])), (lambda: nmse(fn(gs[0]), ref(gu)))
            out.append(Case(name, f"T={t} F={FFN}", 3 * t * FFN * 4, mk_gated))

    for t in (1, 64):
        def mk_softcap(rng, t=t):
            x = rng.normal(0, 20, (t, VOCAB)).astype(np.float32)
            sets = n_sets(2 * x.nbytes)
            xs, os_ = [dev(x) for _ in range(sets)], [cupy.empty_like(dev(x)) for _ in range(sets)]
            return sets, (lambda i: ops.softcap(xs[i], 30.0, out=os_[i])), \
                (lambda: nmse(ops.softcap(xs[0], 30.0), ref_act.softcap(x, 30.0)))
        out.append(Case("softcap", f"T={t} V={VOCAB}", 2 * t * VOCAB * 4, mk_softcap))

    for qtype in (QType.Q4_K, QType.Q6_K, QType.Q8_0, QType.F16):
        for t in (1, 64, 2048):
            def mk_embed(rng, t=t, qtype=qtype):
                rows = 4096                               # a slice of the vocabulary is enough
                table = QuantTensor("token_embd", qtype, (rows, HIDDEN), random_blocks(qtype, rows, HIDDEN, rng, std=1.0))
                dtab = table.to_device()
                ids = rng.integers(0, rows, t).astype(np.int32)
                sets = n_sets(t * HIDDEN * 4)
                is_, os_ = [dev(rng.integers(0, rows, t).astype(np.int32)) for _ in range(sets)], \
                    [cupy.empty((t, HIDDEN), np.float32) for _ in range(sets)]
                return sets, (lambda i: ops.embed(dtab, is_[i], 1.0, out=os_[i])), \
                    (lambda: nmse(ops.embed(dtab, dev(ids), 1.0), ref_matmul.embed(table, ids, 1.0)))
            nbytes = t * (row_bytes(qtype, HIDDEN) + HIDDEN * 4)
            out.append(Case(f"embed {qtype.name}", f"T={t} d={HIDDEN}", nbytes, mk_embed))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--launches", type=int, default=200)
    ap.add_argument("--only", default="", help="substring of the op names to run")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    import cupy
    rng = np.random.default_rng(0)
    rows = []
    name = device_name()
    print(f"# {name}  (CUDA graphs of {args.launches} launches, median of {args.reps})")
    for case in cases():
        if args.only and args.only not in case.name:
            continue
        sets, launch, check = case.make(rng)
        err = check()
        t_op = graph_time_us(launch, sets, args.launches, args.reps)
        t_copy = copy_time_us(case.nbytes, args.launches, args.reps)
        gbs = case.nbytes / t_op / 1e3
        row = dict(op=case.name, size=case.size, bytes=case.nbytes, us=t_op, gbps=gbs,
                   copy_us=t_copy, copy_gbps=case.nbytes / t_copy / 1e3, of_copy=t_copy / t_op, nmse=err)
        rows.append(row)
        print(f"{case.name:<14} {case.size:<18}| {t_op:8.2f} us | {gbs / 1e3:5.2f} TB/s "
              f"({100 * row['of_copy']:3.0f}% of copy, copy {row['copy_gbps'] / 1e3:4.2f} TB/s at these bytes) "
              f"| NMSE {err:.1e}")
        del launch, check
        cupy.get_default_memory_pool().free_all_blocks()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
