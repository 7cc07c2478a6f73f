"""Does the pool's head-interleaved layout set decode attention's read rate?

The KV pool is (cells, kv_heads, D): a block of attn_stream_kernel reads one kv head's 2*D-byte row
of each cell, so the 8 heads of a Qwen3-8B cell are read by 8 blocks at unrelated times. This
probe times the same bytes two ways: 32 query / 8 KV heads over B sequences (rows of 256 bytes,
a cell's heads apart), and 4 query / 1 KV head over 8 B sequences (each block reads whole cells),
each with scattered cells and with every sequence's cells consecutive, beside PyTorch SDPA on
contiguous copies. Same grid shape either way (8 B (token, kv head) units), so the split rule and
the merge are the same; only the addresses differ.

    PYTHONPATH=$PWD python3 bench/probe_attention_layout.py [--contexts 32768,131072] [--batches 1,8]
    ncu --set full -k regex:"attn|flash|fmha|merge|combine" -c 8 python3 bench/probe_attention_layout.py \
        --contexts 32768 --batches 1 --calls 2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_attention import decode_inputs, torch_or_none  # noqa: E402
from glimmer_cupy import ops  # noqa: E402
from glimmer_cupy.benchmarks.timing import copy_bandwidth, n_sets, time_us  # noqa: E402
from glimmer_cupy.ops.attention import workspace_size  # noqa: E402

D = 128


def case(b: int, ctx: int, hq: int, hkv: int, run: int, copy_bw: float, torch, stages, splits, calls: int = 0) -> dict:
    """Time one layout (or, with calls, only make that many eager calls of each kernel, for ncu)."""
    import cupy
    rng = np.random.default_rng(0)
    kv_bytes = b * ctx * hkv * D * 4
    sets = n_sets(kv_bytes)
    k_pool, v_pool, tables, seq_lens, tok_seq, tok_pos, qs, outs = decode_inputs(cupy, rng, b, ctx, sets, run, hq, hkv)
    work = cupy.empty(workspace_size(b, hq, D), dtype=cupy.float32)
    cupy.cuda.Device().synchronize()
    row = dict(batch=b, context=ctx, q_heads=hq, kv_heads=hkv, run_cells=run, times={})

    def ours(st, sp):
        return lambda i: ops.attention(qs[i], k_pool, v_pool, tables[i], seq_lens, tok_seq, tok_pos, D ** -0.5,
                                       out=outs[i], workspace=work, kernel="stream", force_stages=st,
                                       force_splits=sp or None)
    launches = {f"stages {st} splits {sp or 'rule'}": ours(st, sp) for st in stages for sp in splits}
    if torch is not None and run == ctx and hkv == 8:
        import torch.nn.functional as F
        dense = [torch.from_dlpack(cupy.ascontiguousarray(p[tables[0]].transpose(0, 2, 1, 3))).view(torch.bfloat16)
                 for p in (k_pool, v_pool)]
        tq = torch.from_dlpack(qs[0]).to(torch.bfloat16).view(b, hq, 1, D)
        torch.cuda.synchronize()

        def sdpa(i):
            with torch.cuda.stream(torch.cuda.ExternalStream(cupy.cuda.get_current_stream().ptr)):
                return F.scaled_dot_product_attention(tq, dense[0], dense[1], scale=D ** -0.5, enable_gqa=True)
        launches["sdpa (one set, L2 may hold part)"] = sdpa
    for name, launch in launches.items():
        if calls:
            for i in range(calls):
                launch(0 if name.startswith("sdpa") else i % sets)
            cupy.cuda.Device().synchronize()
        else:
            row["times"][name] = time_us(launch, 1 if name.startswith("sdpa") else sets, 50, 20)[0]
    if row["times"]:
        print(f"B={b:<3d} ctx={ctx:<6d} heads {hq}/{hkv} run {run:<6d} | "
              + " | ".join(f"{k}: {v:7.1f} us ({kv_bytes / v / 1e6 / (copy_bw / 1e12):.0%})"
                           for k, v in row["times"].items())
              + f" | best {min(row['times'].values()):.1f}", flush=True)
    cupy.get_default_memory_pool().free_all_blocks()
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="32768,131072")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--stages", default="3")
    ap.add_argument("--splits", default="0", help="split counts to force (0: the rule's)")
    ap.add_argument("--calls", type=int, default=0, help="only this many eager calls of our kernel and of SDPA at "
                    "the first batch and context, consecutive cells, 32/8 heads (for ncu)")
    ap.add_argument("--define", action="append", default=[], metavar="NAME",
                    help="build the kernels with -DNAME (repeatable), for an A/B of a source's switch")
    args = ap.parse_args(argv)
    from glimmer_cupy.kernels import build
    build.add_defines(*args.define)
    torch = torch_or_none()
    copy_bw = copy_bandwidth()
    print(f"# copy {copy_bw / 1e12:.2f} TB/s")
    stages = [int(s) for s in args.stages.split(",")]
    splits = [int(s) for s in args.splits.split(",")]
    if args.calls:
        b, ctx = int(args.batches.split(",")[0]), int(args.contexts.split(",")[0])
        case(b, ctx, 32, 8, ctx, copy_bw, torch, stages, splits, args.calls)
        return 0
    for ctx in (int(c) for c in args.contexts.split(",")):
        for b in (int(x) for x in args.batches.split(",")):
            if b * ctx > (1 << 20):
                continue
            for run in (1, ctx):
                case(b, ctx, 32, 8, run, copy_bw, torch, stages, splits)
                case(8 * b, ctx, 4, 1, run, copy_bw, None, stages, splits)
    return 0


if __name__ == "__main__":
    sys.exit(main())
