"""Where causal prefill on attn_wgmma_kernel spends its tiles: attention_wgmma.cu compiled with
GLIMMER_STAMPS, so every thread sums its SM clock's cycles in each phase of a K/V tile (the next
tile's copies issued, K landed, S = Q K^T, the softmax, V landed, O += P V, the closing barrier) and
thread 0 writes its block's sums. One T-token prompt over scattered cells, one launch (the third of
five). Printed: the launch's µs, each phase's cycles a tile and share of the tile loop, summed over
the blocks, with the clock the loop's cycles and its global-timer span imply; then the spread of a
block's tiles and loop time (with resident blocks, the default, a block's loop spans all its items,
each with its q read and output). Whether the loop waits on its copies (K or V landed), on the tensor
cores (the two multiplies) or on the softmax is what decides the kernel's next form.

    PYTHONPATH=$PWD python3 bench/probe_attention_wgmma.py [--heads 32,8,128] [--rows 64|128]
                                                           [--stages 2|3|4] [--resident 0|1] [T ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import glimmer_cupy.kernels.build as build  # noqa: E402
from bench_attention import prompt_inputs  # noqa: E402
from stamp_stats import module_stamps, spread  # noqa: E402
from glimmer_cupy import ops  # noqa: E402
from glimmer_cupy.ops.attention import (_WGMMA_EXPRS, WGMMA_DEPTH, WGMMA_PERSISTENT, WGMMA_PRODUCER,  # noqa: E402
                                        WGMMA_ROWS, wgmma_runs)

attention = sys.modules["glimmer_cupy.ops.attention"]     # the module (ops.attention is the function)

# attention_wgmma.cu's phases: stamps 8.. hold their cycles in this order
PHASES = ("copies issued", "K landed", "S = Q K^T", "softmax", "V landed", "O += P V", "closing barrier")
START, INPUTS, LOOP, LOOP_END, DONE, TILES, Q_READ, OUTPUT, FIRST_PHASE, LOOP_CYCLES = 0, 1, 2, 3, 4, 5, 6, 7, 8, 15


def probe(t: int, hq: int, hkv: int, d: int, rows: int, stages: int, producer: bool) -> None:
    import cupy
    q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos, out = prompt_inputs(cupy, np.random.default_rng(0), t,
                                                                              hq, hkv, d)
    mod = build._load("attention_wgmma", (), tuple(_WGMMA_EXPRS))
    st = module_stamps(mod)
    runs = []
    for _ in range(5):
        st.fill(0)
        cupy.cuda.Device().synchronize()
        ops.attention(q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos, d ** -0.5, out=out, kernel="wgmma",
                      force_rows=rows, force_stages=stages, force_producer=producer)
        cupy.cuda.Device().synchronize()
        runs.append(cupy.asnumpy(st).astype(np.int64))
    s = runs[2]
    s = s[s[:, START] > 0]
    r = summary(s)
    print(f"T={t} heads {hq}/{hkv} d={d}: {rows}-row blocks, {stages} stages, producer warpgroup {producer}, "
          f"resident blocks {attention.WGMMA_PERSISTENT and producer}, "
          f"{len(s)} blocks, {r['tiles']} tiles; "
          f"launch {r['launch_us']:.1f} µs (first start to last end); clock {r['ghz']:.2f} GHz (the loops' cycles "
          "over their global-timer ns)")
    for name, (cycles, share) in r["phases"].items():
        print(f"   {name:16s} {cycles:8.0f} cycles a tile  {100 * share:5.1f}% of the loop")
    print(f"   a block's tiles: {spread(s[:, TILES].astype(np.float64))}")
    print(f"   a block's loop µs: {spread((s[:, LOOP_END] - s[:, LOOP]) / 1e3)}")
    print(f"   a block's start to loop µs: {spread((s[:, LOOP] - s[:, START]) / 1e3)}")
    print(f"   a block's loop end to done µs: {spread((s[:, DONE] - s[:, LOOP_END]) / 1e3)}", flush=True)


def summary(s: np.ndarray) -> dict:
    """From the stamps of the blocks that ran (blocks, 16): the launch's µs, the tiles, the SM clock
    in GHz (the loops' cycles over their global-timer ns), and {phase: (cycles a tile, share of the
    loop's cycles)}, with the items' q reads and outputs, and "(the rest)" for the loop's cycles outside
    all of them (the tile loop's own steps, each item's wait for its tables)."""
    tiles = int(s[:, TILES].sum())
    loop_cycles = int(s[:, LOOP_CYCLES].sum())
    sums = s[:, FIRST_PHASE:FIRST_PHASE + len(PHASES)].sum(axis=0)
    phases = {name: (c / max(tiles, 1), c / max(loop_cycles, 1)) for name, c in zip(PHASES, sums)}
    items = {"(items' q read)": int(s[:, Q_READ].sum()), "(items' output)": int(s[:, OUTPUT].sum())}
    rest = loop_cycles - sums.sum() - sum(items.values())
    for name, c in items.items():
        phases[name] = (c / max(tiles, 1), c / max(loop_cycles, 1))
    phases["(the rest)"] = (rest / max(tiles, 1), rest / max(loop_cycles, 1))
    return dict(launch_us=(s[:, DONE].max() - s[:, START].min()) / 1e3, tiles=tiles,
                ghz=loop_cycles / max(int((s[:, LOOP_END] - s[:, LOOP]).sum()), 1), phases=phases)

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lengths", nargs="*", type=int, default=[2048], help="prompt lengths T (default 2048)")
    ap.add_argument("--heads", default="32,8,128", metavar="HQ,HKV,D", help="default Qwen3-8B's; SmolLM2's 9,3,64")
    ap.add_argument("--rows", type=int, default=WGMMA_ROWS, help="rows a block (64: two blocks an SM, or 128)")
    ap.add_argument("--stages", type=int, default=WGMMA_DEPTH)
    ap.add_argument("--producer", type=int, choices=(0, 1), default=int(WGMMA_PRODUCER),
                    help="1: a producer warpgroup issues the copies (64-row blocks)")
    ap.add_argument("--resident", type=int, choices=(0, 1), default=int(WGMMA_PERSISTENT),
                    help="1: with the producer, blocks stay resident over several items (0: a block an item)")
    args = ap.parse_args(argv)
    attention.WGMMA_PERSISTENT = bool(args.resident)
    try:
        hq, hkv, d = (int(x) for x in args.heads.split(","))
    except ValueError:
        ap.error(f"--heads: three integers q_heads,kv_heads,head_dim, got {args.heads!r}")
    try:
        runs = wgmma_runs(d, hq // hkv, "wgmma")
    except build.NoDeviceError as e:
        ap.error(str(e))
    if not runs:
        ap.error(f"attn_wgmma_kernel does not run head dim {d}, group {hq // hkv} on this device")
    build.add_defines("GLIMMER_STAMPS")              # here, not at import: the summary's tests import this file
    for t in args.lengths:
        probe(t, hq, hkv, d, args.rows, args.stages, bool(args.producer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
