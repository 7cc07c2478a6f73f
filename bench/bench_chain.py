"""What a small kernel costs between two matmuls in a decode step: the FFN half of a decoder layer
at batch 1, captured as a CUDA graph with programmatic dependent launch, timed with and without
each small kernel.

One layer here is the chain a decode step runs after attention (ops/ calls, M = 1):

    o = W_o · a          h = add_rms_norm_(x, o)      gu = W_gu · h
    act = silu_mul(gu)   d = W_down · act             h = add_rms_norm_(x, d)

Variants drop the norms, the activation or both (the matmul that followed then reads a fixed
int8 input made beforehand), so (full - without) / count is the marginal cost of one such kernel
inside a graph: the most that fusing it into a neighbour could save. Layers rotate over enough
weight sets that L2 never holds the next layer's weights. Prints one line per shape and variant:

    qwen3-8b  full            71.3 us/layer   norm 2.1 us each, silu_mul 2.4 us

    PYTHONPATH=$PWD python3 bench/bench_chain.py [--layers 36] [--reps 20] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy import ops  # noqa: E402
from glimmer_cupy.benchmarks.timing import device_name, graph_time_us  # noqa: E402
from glimmer_cupy.kernels.launch import overlapped  # noqa: E402
from glimmer_cupy.weights.quant_tensor import QType, QuantTensor  # noqa: E402
from glimmer_cupy.weights.random_blocks import random_blocks  # noqa: E402

# name: (hidden, ffn, weight type, layer sets rotated)
SHAPES = {"qwen3-8b": (4096, 12288, QType.Q4_K, 4), "qwen3-0.6b": (1024, 3072, QType.Q4_K, 8),
          "smollm2-135m": (576, 1536, QType.Q4_1, 16)}
VARIANTS = ("full", "no norms", "no silu_mul", "matmuls only")


def layer_sets(hidden: int, ffn: int, qtype: QType, sets: int, rng: np.random.Generator):
    import cupy

    def weight(n, k):
        return QuantTensor("w", qtype, (n, k), cupy.asarray(random_blocks(qtype, n, k, rng, 0.02)))
    return [(weight(hidden, hidden), weight(2 * ffn, hidden), weight(hidden, ffn)) for _ in range(sets)]


def chain(hidden: int, ffn: int, layers, variant: str):
    """launch(i): layer i % len(layers) of the chain, as the decoder calls it."""
    import cupy

    rng = cupy.random.default_rng(0)
    x = rng.standard_normal((1, hidden), dtype=cupy.float32)
    norm_w = 1 + 0.1 * rng.standard_normal(hidden, dtype=cupy.float32)
    a = ops.rms_norm(rng.standard_normal((1, hidden), dtype=cupy.float32), norm_w, 1e-6, q8=True)
    h_fixed = ops.rms_norm(x, norm_w, 1e-6, q8=True)
    act_fixed = ops.silu_mul(rng.standard_normal((1, 2 * ffn), dtype=cupy.float32), q8=True)
    norms = variant in ("full", "no silu_mul")
    act = variant in ("full", "no norms")

    def launch(i):
        wo, wgu, wd = layers[i % len(layers)]
        o = ops.quant_matmul(a, wo)
        h = ops.add_rms_norm_(x, o, norm_w, 1e-6, q8=True) if norms else h_fixed
        gu = ops.quant_matmul(h, wgu)
        g = ops.silu_mul(gu, q8=True) if act else act_fixed
        d = ops.quant_matmul(g, wd)
        if norms:
            ops.add_rms_norm_(x, d, norm_w, 1e-6, q8=True)
    return launch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=36, help="layers per captured graph")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--no-pdl", action="store_true", help="plain launches instead of PDL")
    ap.add_argument("--out", help="write the results as JSON")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    results = {"gpu": device_name(), "pdl": not args.no_pdl, "layers": args.layers, "shapes": {}}
    for name in args.shapes.split(","):
        hidden, ffn, qtype, sets = SHAPES[name]
        layers = layer_sets(hidden, ffn, qtype, sets, rng)
        times = {}
        with overlapped(not args.no_pdl):
            for v in VARIANTS:
                launch = chain(hidden, ffn, layers, v)
                times[v] = graph_time_us(launch, len(layers), args.layers, args.reps)
        norm = (times["full"] - times["no norms"]) / 2
        act = times["full"] - times["no silu_mul"]
        results["shapes"][name] = {"qtype": qtype.name, "us_per_layer": times, "norm_us": norm, "silu_mul_us": act}
        for v in VARIANTS:
            print(f"{name:13s} {v:13s} {times[v]:7.1f} us/layer", flush=True)
        print(f"{name:13s} marginal: add_rms_norm {norm:.2f} us each, silu_mul {act:.2f} us", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
