"""What the fused inputs (ops.norm_input, ops.gated_input) cost in a one-token step's chain.

A PDL graph of L layers' worth of a small model's GEMV chain at one row (SmolLM2-135M's shapes by
default, Q4_1 weights, every layer its own weights so L2 does not hold them):
    x + o -> norm -> gate_up GEMV -> silu * mul -> down GEMV -> x + d -> norm -> qkv GEMV
with the norms and the activation as launches of their own ("separate"), made inside the GEMVs
("fused"), or one of the two fused. Prints µs per layer (median of replays) and how many GEMVs
made their input and how many inputs were made by the separate ops instead.

    python3 bench/probe_fused_input.py [--layers 30] [--hidden 576] [--ffn 1536] [--qkv 960] [--type Q4_1]
"""

from __future__ import annotations

import argparse

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--ffn", type=int, default=1536)
    ap.add_argument("--qkv", type=int, default=960)
    ap.add_argument("--type", default="Q4_1")
    ap.add_argument("--replays", type=int, default=50)
    args = ap.parse_args(argv)

    import cupy

    from glimmer_cupy import ops
    from glimmer_cupy.kernels.launch import overlapped
    from glimmer_cupy.ops import fused_input as fi
    from glimmer_cupy.ops import matmul as mm
    from glimmer_cupy.weights.quant_tensor import QType, QuantTensor
    from glimmer_cupy.weights.random_blocks import random_blocks

    counts = {"fused": 0, "made apart": 0}
    fused_gemv = mm._gemv_fused

    def counted(*a, **k):
        counts["fused"] += 1
        return fused_gemv(*a, **k)
    mm._gemv_fused = counted
    for cls in (fi.NormInput, fi.GatedInput):
        def made(self, _orig=cls.materialize):
            counts["made apart"] += 1
            return _orig(self)
        cls.materialize = made

    rng = np.random.default_rng(0)
    q = QType[args.type]
    h, f = args.hidden, args.ffn

    def weights(n, k):
        return QuantTensor("w", q, (n, k), random_blocks(q, n, k, rng, 0.05)).to_device()
    layers = [(weights(2 * f, h), weights(h, f), weights(args.qkv, h)) for _ in range(args.layers)]
    norm_w = cupy.asarray((1 + 0.1 * rng.standard_normal(h)).astype(np.float32))
    o = cupy.asarray(rng.normal(0, 1, (1, h)).astype(np.float32))
    x0 = cupy.asarray(rng.normal(0, 1, (1, h)).astype(np.float32))

    def chain(fuse_norm: bool, fuse_act: bool):
        x = x0.copy()
        for gate_up, down, qkv in layers:
            if fuse_norm:
                hh = ops.norm_input(x, o, norm_w, 1e-5)
                x = hh.residual
            else:
                hh = ops.add_rms_norm_(x, o, norm_w, 1e-5, q8=True)
            gu = ops.quant_matmul(hh, gate_up)
            act = ops.gated_input(gu, "silu") if fuse_act else ops.silu_mul(gu, q8=True)
            d = ops.quant_matmul(act, down)
            if fuse_norm:
                hh = ops.norm_input(x, d, norm_w, 1e-5)
                x = hh.residual
            else:
                hh = ops.add_rms_norm_(x, d, norm_w, 1e-5, q8=True)
            ops.quant_matmul(hh, qkv)

    stream = cupy.cuda.Stream(non_blocking=True)
    print(f"{args.layers} layers, hidden {h}, ffn {f}, qkv {args.qkv}, {args.type}; µs per layer, PDL graph")
    for name, fn, fa in (("separate", False, False), ("fused norms", True, False), ("fused activation", False, True),
                         ("fused both", True, True), ("separate again", False, False)):
        with stream, overlapped():
            chain(fn, fa)
            stream.synchronize()
            counts.update({"fused": 0, "made apart": 0})
            stream.begin_capture()
            chain(fn, fa)
            graph = stream.end_capture()
            seen = dict(counts)
            for _ in range(5):
                graph.launch(stream)
            times = []
            for _ in range(args.replays):
                a, b = cupy.cuda.Event(), cupy.cuda.Event()
                a.record(stream)
                graph.launch(stream)
                b.record(stream)
                b.synchronize()
                times.append(cupy.cuda.get_elapsed_time(a, b) * 1e3 / args.layers)
        print(f"  {name:18s} {np.median(times):7.2f} (p10 {np.percentile(times, 10):6.2f}, p90 "
              f"{np.percentile(times, 90):6.2f})   GEMVs that made their input: {seen['fused']}, "
              f"inputs made apart: {seen['made apart']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
