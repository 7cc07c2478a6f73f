"""Where a standalone decode attention call on attn_stream_kernel spends its time: attention_stream.cu
compiled with GLIMMER_STAMPS (cuda_src/stamps.cuh), so thread 0 of every block writes the global
timer at each stage. Qwen3-8B heads over scattered cells, one launch per case (the third of five);
printed in µs from the first block's start: min / p10 / median / p90 / max over the blocks that
reach the stage.

    PYTHONPATH=$PWD python3 bench/probe_attention_stream.py [-DNAME ...] [--warm] [--evict] [--cluster-policy=NAME]
        [B:CONTEXT[:SPLITS[:CODES]] ...]

(SPLITS 0: the rule; CODES 1: int8 codes out too; -DNAME: attention_stream.cu built with that switch;
--warm: a call at a context of WARM_CONTEXT positions runs just before each timed one, so that the
kernel's code is in L2 when it starts: a timed call streams more than L2 holds, so without it the
code of the call before is gone and every block's first instructions come from DRAM; --evict: then
a 64 KB stretch of other code runs on every SM (cold_chain<4096>), so that with --warm the code is
in L2 but not in the SMs: --warm against --warm --evict is what the SMs' instruction caches give.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import glimmer_cupy.kernels.build as build  # noqa: E402

build.add_defines("GLIMMER_STAMPS")

from bench_attention import D, HQ, random_pool, scattered_cells, use_placement  # noqa: E402
from stamp_stats import STREAM_STAGES, module_smids, module_stamps, print_by_sm, print_spans, print_stages  # noqa: E402
from glimmer_cupy import ops  # noqa: E402
from glimmer_cupy.kernels.build import get_kernel, sm_count  # noqa: E402
from glimmer_cupy.ops.attention import _STREAM_EXPRS, workspace_size  # noqa: E402

STAGES = STREAM_STAGES
# each block's own spans between these stages (5 -> 12 -> 13 -> 14 -> 15 -> 6: the block's end,
# attn_mma_end.cuh's end_block, for a pushed cluster merge)
PAIRS = ((0, 4), (4, 5), (0, 5), (5, 6), (5, 12), (12, 13), (13, 14), (14, 15), (15, 6), (6, 8), (8, 7), (8, 10),
         (10, 11), (11, 7))
WARM_CONTEXT = 256
EVICTOR = "cold_chain<4096>"        # cuda_src/cold_code_probe.cu: 64 KB of straight-line code
CASES = ((1, 8192, None), (1, 32768, None), (1, 32768, 16), (8, 32768, None))   # batch, context, splits


def probe(b: int, ctx: int, splits, q8: bool = False, warm: bool = False, evict: bool = False) -> None:
    import cupy
    rng = np.random.default_rng(0)
    cells = b * ctx + 1
    k_pool, v_pool = random_pool(cupy, cells), random_pool(cupy, cells)
    table = cupy.asarray(scattered_cells(rng, cells - 1, 1)).reshape(b, ctx)
    seq_lens = cupy.full(b, ctx, dtype=cupy.int32)
    tok_seq = cupy.arange(b, dtype=cupy.int32)
    tok_pos = cupy.full(b, ctx - 1, dtype=cupy.int32)
    q = cupy.asarray(rng.normal(0, 1, (b, HQ, D)).astype(np.float32))
    out = cupy.empty((b, HQ, D), dtype=cupy.float32)
    work = cupy.empty(workspace_size(b, HQ, D), cupy.float32)

    def call(table=table, seq_lens=seq_lens, tok_pos=tok_pos):
        ops.attention(q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos, D ** -0.5, out=out, workspace=work,
                      kernel="stream", force_splits=splits or None, q8=q8)
    short = (table[:, :WARM_CONTEXT].copy(), cupy.full(b, WARM_CONTEXT, dtype=cupy.int32),
             cupy.full(b, WARM_CONTEXT - 1, dtype=cupy.int32))
    call()
    cupy.cuda.Device().synchronize()
    mod = build._load("attention_stream", (), tuple(_STREAM_EXPRS))
    st, sms = module_stamps(mod), module_smids(mod)
    evictor = get_kernel("cold_code_probe", EVICTOR, name_expressions=(EVICTOR,))
    n_sm = sm_count()
    scratch, evict_stamps = cupy.empty(n_sm * 32, np.float32), cupy.zeros(2 * n_sm, np.uint64)
    runs = []
    for _ in range(5):
        if warm:
            call(*short)
        if evict:
            evictor((n_sm,), (32,), (scratch, evict_stamps, np.float32(0.999)))
        st.fill(0)
        cupy.cuda.Device().synchronize()
        call()
        cupy.cuda.Device().synchronize()
        runs.append((cupy.asnumpy(st).astype(np.int64), cupy.asnumpy(sms)))
    s, smids = runs[2]
    used = s[:, 0] > 0
    t0 = s[used, 0].min()
    print(f"B={b} ctx={ctx} splits={splits or 'rule'} blocks={int(used.sum())}{' with int8 codes' if q8 else ''}"
          f"{f', code warmed by a {WARM_CONTEXT}-position call' if warm else ''}"
          f"{', then the SMs given 64 KB of other code' if evict else ''}")
    print_stages(s[used], t0, STAGES)
    print_spans(s[used], STAGES, PAIRS)
    print_by_sm(s[used], smids[used], 4, 5)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    build.add_defines(*(a[2:] for a in argv if a.startswith("-D")))      # a source's switches, e.g. -DATTN_LAST_ACQREL
    warm, evict = "--warm" in argv, "--evict" in argv
    use_placement(next((a.split("=", 1)[1] for a in argv if a.startswith("--cluster-policy=")), None))
    cases = [tuple(int(v) for v in a.split(":")) for a in argv if not a.startswith("-")] or CASES
    for case in cases:
        probe(case[0], case[1], case[2] if len(case) > 2 else None, len(case) > 3 and case[3] != 0, warm, evict)
        import cupy
        cupy.get_default_memory_pool().free_all_blocks()       # the case's pools, before the next one's
    return 0


if __name__ == "__main__":
    sys.exit(main())
