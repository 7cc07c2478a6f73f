"""What a small kernel costs between two matmuls in a decode step: the two halves of a decoder
layer at batch 1, captured as a CUDA graph with programmatic dependent launch, timed with and
without each small kernel.

The FFN half is the chain a decode step runs after attention (ops/ calls, M = 1):

    o = W_o · a          h = add_rms_norm_(x, o)      gu = W_gu · h
    act = silu_mul(gu)   d = W_down · act             h = add_rms_norm_(x, d)

and the attention half the chain before it, over CONTEXT positions of one sequence whose cell
table is TABLE wide (as a captured step's is):

    qkv = W_qkv · h      q = prepare_qkv_(qkv)        a = attention(q)

Variants drop kernels (what followed then reads a fixed input made beforehand), so
(full - without) / count is the marginal cost of one such kernel inside a graph: the most that
fusing it into a neighbour could save. Layers rotate over enough weight and pool sets that L2
never holds the next layer's weights. Prints one line per shape and variant:

    qwen3-8b      ffn  full            39.0 us/layer

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
from bench_attention import decode_token_inputs  # noqa: E402
from glimmer_cupy.weights.quant_tensor import QType, QuantTensor  # noqa: E402
from glimmer_cupy.weights.random_blocks import random_blocks  # noqa: E402

# name: (hidden, ffn, q heads, kv heads, head_dim, qk norm, weight type, layer sets rotated)
SHAPES = {"qwen3-8b": (4096, 12288, 32, 8, 128, True, QType.Q4_K, 4),
          "qwen3-0.6b": (1024, 3072, 16, 8, 128, True, QType.Q4_K, 8),
          "smollm2-135m": (576, 1536, 9, 3, 64, False, QType.Q4_1, 16)}
FFN_VARIANTS = ("full", "no norms", "no silu_mul", "matmuls only")
ATTN_VARIANTS = ("full", "full, mma kernel", "full, simt kernel", "no prepare_qkv", "no attention", "matmul only")
CONTEXT, TABLE = 600, 1024


def weight(qtype: QType, n: int, k: int, rng: np.random.Generator):
    import cupy
    return QuantTensor("w", qtype, (n, k), cupy.asarray(random_blocks(qtype, n, k, rng, 0.02)))


def layer_sets(hidden: int, ffn: int, qtype: QType, sets: int, rng: np.random.Generator):
    return [(weight(qtype, hidden, hidden, rng), weight(qtype, 2 * ffn, hidden, rng), weight(qtype, hidden, ffn, rng))
            for _ in range(sets)]


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


def attention_chain(shape, sets: int, variant: str, rng: np.random.Generator):
    """launch(i): layer i % sets of the attention half: qkv matmul, prepare_qkv_, attention."""
    import cupy

    hidden, _, hq, hkv, d, qk_norm, qtype, _ = shape
    crng = cupy.random.default_rng(1)
    layers = []
    for _ in range(sets):
        w = weight(qtype, (hq + 2 * hkv) * d, hidden, rng)
        pools = [(crng.standard_normal((TABLE, hkv, d), dtype=cupy.float32).view(cupy.uint32) >> 16)
                 .astype(cupy.uint16) for _ in range(2)]                   # bf16 bits of N(0, 1)
        layers.append((w, *pools))
    norm_w = 1 + 0.1 * crng.standard_normal(hidden, dtype=cupy.float32)
    h = ops.rms_norm(crng.standard_normal((1, hidden), dtype=cupy.float32), norm_w, 1e-6, q8=True)
    qk_w = (1 + 0.1 * crng.standard_normal(d, dtype=cupy.float32)) if qk_norm else None
    table, seq_lens, tok_seq, pos, cells, ws = decode_token_inputs(TABLE, CONTEXT, hq, d)
    q_fixed = crng.standard_normal((1, hq, d), dtype=cupy.float32)
    # the default kernel (ops.attention's: attn_stream_kernel for these decode steps), or the named one
    kernel = "mma" if "mma kernel" in variant else "simt" if "simt kernel" in variant else "stream"
    splits = int(variant.split()[-2]) if variant.endswith(" splits") else None     # "full, 8 splits"

    def launch(i):
        w, k_pool, v_pool = layers[i % sets]
        qkv = ops.quant_matmul(h, w)
        q = q_fixed
        if variant != "no prepare_qkv" and variant != "matmul only":
            q = ops.prepare_qkv_(qkv, k_pool, v_pool, cells, pos, hq, hkv, qk_w, qk_w, 1e-6, 1e6, True)
        if variant != "no attention" and variant != "matmul only":
            ops.attention(q, k_pool, v_pool, table, seq_lens, tok_seq, pos, d ** -0.5, workspace=ws, q8=True,
                          kernel=kernel, force_splits=splits)
    return launch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=36, help="layers per captured graph")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--no-pdl", action="store_true", help="plain launches instead of PDL")
    ap.add_argument("--halves", default="ffn,attn", help="which halves of a layer to time")
    ap.add_argument("--splits", default="", help="also time attention with these split counts, e.g. 1,4,16")
    ap.add_argument("--out", help="write the results as JSON")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    results = {"gpu": device_name(), "pdl": not args.no_pdl, "layers": args.layers, "context": CONTEXT,
               "table": TABLE, "shapes": {}}
    for name in args.shapes.split(","):
        hidden, ffn, _, _, _, _, qtype, sets = shape = SHAPES[name]
        layers = layer_sets(hidden, ffn, qtype, sets, rng)
        ffn_t, attn_t = {}, {}
        with overlapped(not args.no_pdl):
            for v in FFN_VARIANTS if "ffn" in args.halves else ():
                ffn_t[v] = graph_time_us(chain(hidden, ffn, layers, v), sets, args.layers, args.reps)
                print(f"{name:13s} ffn  {v:17s} {ffn_t[v]:7.1f} us/layer", flush=True)
            for v in (ATTN_VARIANTS + tuple(f"full, {n} splits" for n in args.splits.split(",") if n)
                      if "attn" in args.halves else ()):
                attn_t[v] = graph_time_us(attention_chain(shape, sets, v, rng), sets, args.layers, args.reps)
                print(f"{name:13s} attn {v:17s} {attn_t[v]:7.1f} us/layer", flush=True)
        marginal = {}
        if ffn_t:
            marginal.update({"add_rms_norm": (ffn_t["full"] - ffn_t["no norms"]) / 2,
                             "silu_mul": ffn_t["full"] - ffn_t["no silu_mul"]})
        if attn_t:
            marginal.update({"prepare_qkv": attn_t["full"] - attn_t["no prepare_qkv"],
                             "attention": attn_t["full"] - attn_t["no attention"],
                             "attention (mma)": attn_t["full, mma kernel"] - attn_t["no attention"],
                             "attention (simt)": attn_t["full, simt kernel"] - attn_t["no attention"]})
        results["shapes"][name] = {"qtype": qtype.name, "ffn_us_per_layer": ffn_t, "attn_us_per_layer": attn_t,
                                   "marginal_us": marginal}
        print(f"{name:13s} marginal: " + ", ".join(f"{k} {v:.2f} us" for k, v in marginal.items()), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
