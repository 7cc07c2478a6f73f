"""Where a mma_st call's time goes: mma_st.cu compiled with GLIMMER_STAMPS (cuda_src/stamps.cuh), so
thread 0 of every block writes the global timer at each stage, of the matmul and of its x stage
kernel. The call runs as decode runs it: a PDL graph of calls over weights rotated past L2; the
stamps are those of the graph's last call. Printed in µs from the earliest stamp of that call (the
stage kernel's or the matmul's first block): min / p10 / median / p90 / max over the blocks.

    PYTHONPATH=$PWD python3 bench/probe_mma_st.py [-DNAME ...] [TYPE:N:K:M[:SPLITS[:TMA[:RG:WK]]] ...]

(SPLITS 0 or absent: mma_st_config's rule; TMA 1: mma_st_tma_kernel (Q4_K), whose stage 3 is the first
chunk landed, RG:WK its block shape (matmul.MMA_ST_TMA_SHAPES; default 4:1); -DNAME: mma_st.cu built
with that switch.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import glimmer_cupy.kernels.build as build  # noqa: E402

build.add_defines("GLIMMER_STAMPS")

from stamp_stats import module_stamps, print_spans, print_stages  # noqa: E402
from glimmer_cupy.benchmarks.matmul_sets import m1_us, weight_sets  # noqa: E402
from glimmer_cupy.benchmarks.timing import graph_time_us  # noqa: E402
from glimmer_cupy.kernels.launch import overlapped  # noqa: E402
from glimmer_cupy.ops import matmul  # noqa: E402
from glimmer_cupy.weights.quant_tensor import QType  # noqa: E402

# mma_st_kernel's stages (mma_st.cu: STAMP(i) is stage i; 5 only where K is split)
STAGES = ("start", "W copies issued", "waited", "W and x landed", "multiplies done", "cluster met", "end")
STAGE_X = ("start", "waited", "end")             # mma_st_stage_x_kernel's, from row kStageStampRow
STAGE_ROW = 3072                                 # kStageStampRow in mma_st.cu
PAIRS = ((0, 1), (0, 2), (2, 3), (0, 3), (3, 4), (4, 5), (5, 6), (4, 6), (0, 6))
CASES = ("Q4_K:4096:4096:16", "Q4_K:4096:4096:1", "Q4_K:4096:4096:16:2", "Q4_K:4096:4096:16:4",
         "Q4_K:24576:4096:16", "Q4_K:4096:12288:16", "Q6_K:4096:4096:16", "Q6_K:4096:12288:16",
         "Q4_K:4096:4096:16:0:1", "Q4_K:4096:4096:16:2:1", "Q4_K:24576:4096:16:0:1")


def probe(qtype: QType, n: int, k: int, m: int, splits, tma: bool = False, rg: int = 4, wk: int = 1,
          launches: int = 20) -> None:
    import cupy
    rng = np.random.default_rng(5)
    ws = weight_sets(qtype, n, k, rng)
    xs = [cupy.asarray(rng.normal(0, 1, (m, k)).astype(np.float32)) for _ in ws]
    outs = [cupy.empty((m, n), np.float32) for _ in ws]
    m1 = m1_us(ws, rng, 50, 5)

    def call(i):
        matmul.mma_st(outs[i], xs[i], ws[i], splits=splits, tma=tma, rg=rg, wk=wk)
    with overlapped(True):
        us = graph_time_us(call, len(ws), launches, 5)
    mod = build.load_module("mma_st", None, matmul.mma_st_exprs(matmul.MMA_ST_LANES[qtype][0]))
    st = module_stamps(mod)
    st.fill(0)
    with overlapped(True):                       # one more graph replay, its stamps kept
        graph_time_us(call, len(ws), launches, 1)
    s = cupy.asnumpy(st).astype(np.int64)
    mat, stage = s[:STAGE_ROW], s[STAGE_ROW:]
    mat, stage = mat[mat[:, 0] > 0], stage[stage[:, 0] > 0]
    t0 = min(mat[:, 0].min(), stage[:, 0].min() if len(stage) else mat[:, 0].min())
    nt, ks = matmul.mma_st_config(m, n, k, qtype, tma, rg, wk)
    ks = splits or ks
    print(f"{qtype.name} {n}x{k} M={m} splits={ks}{f' tma {rg}x{wk}' if tma else ''} blocks={len(mat)} "
          f"(stage kernel {len(stage)}): {us:.1f} us a call in the graph, the table's M = 1 {m1:.1f} us; "
          f"smem {matmul.mma_st_smem(nt, k, ks, qtype, tma, rg, wk)} B a block", flush=True)
    if len(stage):
        print("  x stage kernel:")
        print_stages(stage[:, :3], t0, STAGE_X, indent="    ")
    print("  matmul:")
    names = STAGES if ks > 1 else STAGES[:5] + ("-",) + STAGES[6:]
    print_stages(mat[:, :7], t0, names, indent="    ")
    print_spans(mat[:, :7], names, PAIRS if ks > 1 else tuple(p for p in PAIRS if 5 not in p), indent="    ")
    # how many blocks each SM ran at once: the start of the last block against the first end
    print(f"    last block start {(mat[:, 0].max() - t0) / 1e3:.2f} us, first block end {(mat[:, 6].min() - t0) / 1e3:.2f} us,"
          f" last end {(mat[:, 6].max() - t0) / 1e3:.2f} us", flush=True)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    build.add_defines(*(a[2:] for a in argv if a.startswith("-D")))
    cases = [a for a in argv if not a.startswith("-")] or CASES
    for case in cases:
        parts = case.split(":")
        probe(QType[parts[0]], int(parts[1]), int(parts[2]), int(parts[3]), int(parts[4]) if len(parts) > 4 and
              int(parts[4]) else None, len(parts) > 5 and parts[5] == "1",
              *(int(v) for v in parts[6:8]))
        import cupy
        cupy.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
