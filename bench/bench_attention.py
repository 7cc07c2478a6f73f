"""Time decode attention over the KV cell pool on the GPU, against the copy ceiling and PyTorch SDPA.

Qwen3-8B geometry (--heads for another): 32 query heads, 8 KV heads, head_dim 128, bf16 K and V in a pool whose cells
each sequence holds in scattered (permuted) order (--run-cells R: in runs of R consecutive cells,
the runs scattered). One query token per sequence, batch 1, 8, 32, 64 at context 1k, 8k, 32k
and 128k (where the pool fits). For each case: µs per call (CUDA graph of many calls, pools
rotated so L2 never holds the next call's cells), K+V bytes read per second and its fraction of
the device-to-device copy bandwidth measured in this run, the split count, and PyTorch's
scaled_dot_product_attention (bf16, contiguous K/V, enable_gqa) on the same work where torch
imports, with the NMSE between the two outputs as a cross-check. JSON and a markdown table.

    PYTHONPATH=$PWD python3 bench/bench_attention.py --out bench/results/attention

--graph: decode as a step's graph runs it (the batch-1 M = 1 attention half's tail, as
bench/bench_chain.py): prepare_qkv_ then attention (q8 codes on) at 600 and 1024 positions of a
1024-wide table, captured with programmatic dependent launch, pools rotated past L2. Prints the
graph's µs per layer with prepare_qkv_ alone and the attention's marginal cost on top of it for
each kernel variant (graph_variants: tensor cores by the rule, with the global merge, with neither
decode shortcut as before 5ac370d, with both forced; CUDA cores), for Qwen3-8B, SmolLM2-135M and
Gemma 3 270M shapes (head dim 256: the rule takes no shortcut there):

    PYTHONPATH=$PWD python3 bench/bench_attention.py --graph --batches 0 [--no-pdl]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy.benchmarks.timing import (copy_bandwidth, graph_time_us, n_sets, run_meta, time_us,  # noqa: E402
                                            write_results)
from glimmer_cupy import ops  # noqa: E402
from glimmer_cupy.kernels.build import sm_count  # noqa: E402
from glimmer_cupy.kernels import launch  # noqa: E402
from glimmer_cupy.kernels.launch import overlapped  # noqa: E402
from glimmer_cupy.ops.attention import (CLUSTER_SIZES, MMA_DEPTH, MMA_TILE, MMA_VARIANTS,  # noqa: E402
                                        WGMMA_PERSISTENT, WGMMA_PRODUCER, WGMMA_VARIANTS, mma_cluster,
                                        mma_cluster_cap, mma_plan, n_splits, stream_splits, wgmma_plan,
                                        wgmma_runs, workspace_size)

HQ, HKV, D = 32, 8, 128                       # Qwen3-8B
BATCHES = (1, 8, 32, 64)
CONTEXTS = (1024, 8192, 32768, 131072)


def torch_or_none():
    try:
        import torch
        return torch if torch.cuda.is_available() else None
    except ImportError:
        return None


def random_pool(cupy, cells: int, hkv: int | None = None, d: int | None = None):
    """A (cells, hkv, d) pool (the run's heads by default) of bf16 bits of N(0, 1) values, made on
    the device."""
    pool = cupy.empty((cells, hkv or HKV, d or D), dtype=cupy.uint16)
    step = 1 << 16                                        # cells per fill: bounds the float32 temporary
    for c in range(0, cells, step):
        x = cupy.random.standard_normal(pool[c:c + step].shape, dtype=cupy.float32)
        pool[c:c + step] = (x.view(cupy.uint32) >> 16).astype(cupy.uint16)
    return pool


def scattered_cells(rng, n: int, run: int) -> np.ndarray:
    """Cells 1..n in runs of `run` consecutive cells, the runs in random order (run 1: every cell
    on its own, the worst case for DRAM; a fresh pool's FIFO free list gives one long run)."""
    if n % run:
        raise ValueError(f"bench_attention: --run-cells {run} does not divide the {n} cells of a case")
    starts = rng.permutation(n // run).astype(np.int64) * run + 1
    return (starts[:, None] + np.arange(run)).ravel().astype(np.int32)


def decode_inputs(cupy, rng, b: int, ctx: int, sets: int, run_cells: int = 1, hq: int | None = None,
                  hkv: int | None = None):
    """One query token for each of b sequences of ctx positions, `sets` copies to rotate over:
    (k_pool, v_pool, tables, seq_lens, tok_seq, tok_pos, qs, outs). Every set's sequences own
    disjoint cells of one pool, in runs of run_cells (scattered_cells); cell 0 is the scratch."""
    hq, hkv = hq or HQ, hkv or HKV                        # the run's heads (--heads) unless given
    cells = sets * b * ctx + 1
    k_pool, v_pool = random_pool(cupy, cells, hkv), random_pool(cupy, cells, hkv)
    perm = cupy.asarray(scattered_cells(rng, cells - 1, run_cells))
    tables = [perm[i * b * ctx:(i + 1) * b * ctx].reshape(b, ctx) for i in range(sets)]
    seq_lens = cupy.full(b, ctx, dtype=cupy.int32)
    tok_seq = cupy.arange(b, dtype=cupy.int32)
    tok_pos = cupy.full(b, ctx - 1, dtype=cupy.int32)
    qs = [cupy.asarray(rng.normal(0, 1, (b, hq, D)).astype(np.float32)) for _ in range(sets)]
    outs = [cupy.empty((b, hq, D), dtype=cupy.float32) for _ in range(sets)]
    return k_pool, v_pool, tables, seq_lens, tok_seq, tok_pos, qs, outs


def run_case(b: int, ctx: int, rng, launches: int, reps: int, copy_bw: float, torch, splits_sweep,
             mma: bool = False, stages=(), run_cells: int = 1, stream: bool = False, sweep_kernel: str = "simt",
             sweep_cluster: int | None = None):
    import cupy
    kv_bytes = b * ctx * HKV * D * 2 * 2                  # K and V, bf16
    sets = n_sets(kv_bytes)
    k_pool, v_pool, tables, seq_lens, tok_seq, tok_pos, qs, outs = decode_inputs(cupy, rng, b, ctx, sets, run_cells)
    work = cupy.empty(workspace_size(b, HQ, D), dtype=cupy.float32)
    scale = D ** -0.5
    splits = n_splits(b * HKV, ctx, sm_count())
    # Everything above ran on the legacy default stream (cuRAND fills, async uploads of the cell
    # tables and q, full/arange of seq_lens, tok_seq, tok_pos); time_us launches on a non-blocking
    # stream, which does not wait for it. Without this sync the first launches can read index
    # arrays not yet written, i.e. stale pool memory, as cells and sequence ids: wild addresses
    # (B=8 ctx=8192 on the H200: cudaErrorInvalidAddressSpace).
    cupy.cuda.Device().synchronize()

    def launch(i, force=None, kernel="simt", st=None, cluster=None):
        ops.attention(qs[i], k_pool, v_pool, tables[i], seq_lens, tok_seq, tok_pos, scale,
                      out=outs[i], workspace=work, force_splits=force, kernel=kernel, force_stages=st,
                      force_cluster=cluster)
    rows = sorted({0, b - 1})                             # the arbiter's rows (below)

    def beside(kernel):
        """(µs, NMSE of the first and last sequence against the exact rows, {depth: µs}) of `kernel`,
        run before simt so that outs[0] ends as simt's for the checks below."""
        us_k = time_us(lambda i: launch(i, kernel=kernel), sets, launches, reps)[0]
        err = nmse(cupy, outs[0][rows], exact_rows(cupy, qs[0], k_pool, v_pool, tables[0], rows, scale))
        depths = {st: time_us(lambda i, st=st: launch(i, kernel=kernel, st=st), sets, launches, reps)[0]
                  for st in stages}                   # the pipeline depths beside the rule's
        return us_k, err, depths
    mma_us, mma_nmse, mma_stages = beside("mma") if mma else (None, None, {})
    stream_us, stream_nmse, stream_stages = beside("stream") if stream else (None, None, {})
    us, how = time_us(launch, sets, launches, reps)
    row = dict(batch=b, context=ctx, run_cells=run_cells, splits=splits, us=us, kv_gbps=kv_bytes / us / 1e3,
               of_copy=kv_bytes / us / 1e3 / (copy_bw / 1e9), timing=how, sweep={},
               torch_us=None, torch_gbps=None, torch_timing=None, nmse_vs_torch=None,
               nmse_vs_exact=None, torch_nmse_vs_exact=None, nonfinite_out=None, torch_backend=None,
               mma_us=mma_us, mma_nmse_vs_exact=mma_nmse, mma_stages=mma_stages,
               mma_rule_stages=MMA_DEPTH if mma else None, stream_us=stream_us, stream_nmse_vs_exact=stream_nmse,
               stream_stages=stream_stages, sweep_kernel=sweep_kernel, sweep_cluster=sweep_cluster,
               stream_splits=stream_splits(b * HKV, ctx, sm_count(), D) if stream else None,
               stream_gbps=kv_bytes / stream_us / 1e3 if stream_us else None,
               stream_of_copy=kv_bytes / stream_us / 1e3 / (copy_bw / 1e9) if stream_us else None)
    for s in splits_sweep:
        row["sweep"][s] = time_us(lambda i, s=s: launch(i, s, kernel=sweep_kernel, cluster=sweep_cluster), sets,
                                  launches, reps)[0]
    # the arbiter: the first and the last sequence (the largest cell indices and offsets), exactly
    exact = exact_rows(cupy, qs[0], k_pool, v_pool, tables[0], rows, scale)
    row["nmse_vs_exact"] = nmse(cupy, outs[0][rows], exact)
    row["nonfinite_out"] = int((~cupy.isfinite(outs[0])).sum())
    if torch is not None:
        row.update(torch_case(torch, k_pool, v_pool, tables, qs, outs, sets, b, ctx, scale, launches, reps,
                              kv_bytes, rows, exact))
    print(f"attention decode B={b:<3d} ctx={ctx:<6d} | {us:8.1f} us | {row['kv_gbps'] / 1e3:5.2f} TB/s "
          f"({100 * row['of_copy']:3.0f}% of copy) | {splits:3d} splits ({how})"
          + (f" | torch SDPA: {row['torch_us']:8.1f} us ({row['torch_gbps'] / 1e3:4.2f} TB/s, {row['torch_timing']})"
             f" NMSE {row['nmse_vs_torch']:.1e} (SDPA vs exact {row['torch_nmse_vs_exact']:.1e}, {row['torch_backend']})"
             if row["torch_us"] else "")
          + f" | kernel vs exact (seqs 0, B-1) {row['nmse_vs_exact']:.1e}, non-finite {row['nonfinite_out']}"
          + (f" | mma: {mma_us:.1f} us ({row['mma_rule_stages']} stages), vs exact {mma_nmse:.1e}" if mma else "")
          + "".join(f" | mma {st} stages: {t:.1f} us" for st, t in mma_stages.items())
          + (f" | stream: {stream_us:.1f} us ({100 * row['stream_of_copy']:.0f}% of copy, "
             f"{row['stream_splits']} splits), vs exact {stream_nmse:.1e}" if stream else "")
          + "".join(f" | stream {st} stages: {t:.1f} us" for st, t in stream_stages.items())
          + "".join(f" | {sweep_label(row)} {s} splits: {t:.1f} us" for s, t in row["sweep"].items()), flush=True)
    return row


def sweep_label(row) -> str:
    """The kernel a row's --splits sweep timed, and its cluster size where --sweep-cluster set one."""
    cluster = row.get("sweep_cluster")
    return row["sweep_kernel"] + (f" (cluster {cluster})" if cluster else "")


# --graph: name -> (q heads, kv heads, head_dim, q/k norm)
GRAPH_SHAPES = {"qwen3-8b": (32, 8, 128, True), "smollm2-135m": (9, 3, 64, False), "gemma3-270m": (4, 1, 256, True)}
GRAPH_CONTEXTS, GRAPH_TABLE = (600, 1024), 1024


def graph_variants(d: int, splits: int) -> dict:
    """name -> attention keywords: the rule; the global merge (early copies as the rule has them);
    neither shortcut (the kernel before 5ac370d); both forced (one cluster where the splits fit
    one, else the global merge); CUDA cores; the decode kernel by the rule and with the global
    merge."""
    c = next((c for c in CLUSTER_SIZES if c >= splits), 1)
    both = c if 1 < c <= mma_cluster_cap(d, 1, MMA_DEPTH) else 1
    return {"mma": dict(kernel="mma"), "mma, global merge": dict(kernel="mma", force_cluster=1),
            "mma, no shortcuts": dict(kernel="mma", force_cluster=1, force_early=False),
            "mma, both shortcuts": dict(kernel="mma", force_cluster=both, force_early=True),
            "simt": dict(kernel="simt"), "stream": dict(kernel="stream"),
            "stream, global merge": dict(kernel="stream", force_cluster=1)}


def decode_token_inputs(width: int, ctx: int, hq: int, d: int):
    """One decode token at the last of ctx positions of one sequence whose cells are a fixed
    permutation of a `width`-wide table (a captured step's): (table, seq_lens, tok_seq, pos, cells,
    workspace), cells being the token's own."""
    import cupy
    table = cupy.asarray(np.random.default_rng(2).permutation(width).astype(np.int32)[None, :])
    seq_lens = cupy.asarray([ctx], dtype=cupy.int32)
    tok_seq = cupy.zeros(1, dtype=cupy.int32)
    pos = cupy.asarray([ctx - 1], dtype=cupy.int32)
    cells = table[0, ctx - 1:ctx].copy()
    return table, seq_lens, tok_seq, pos, cells, cupy.empty(workspace_size(1, hq, d), dtype=cupy.float32)


def graph_chain(name: str, ctx: int):
    """One decode token's attention half after its qkv matmul, as a step's graph runs it: (launch,
    sets, outs), launch(i, attn) running prepare_qkv_ and, given attention keywords, the attention
    on input set i (pools and q rotated so that L2 does not hold the next call's), writing outs[i]."""
    import cupy
    hq, hkv, d, qk_norm = GRAPH_SHAPES[name]
    crng = cupy.random.default_rng(ctx)
    sets = n_sets(GRAPH_TABLE * hkv * d * 2 * 2)
    pools = [tuple((crng.standard_normal((GRAPH_TABLE, hkv, d), dtype=cupy.float32).view(cupy.uint32) >> 16)
                   .astype(cupy.uint16) for _ in range(2)) for _ in range(sets)]          # bf16 bits of N(0, 1)
    qkvs = [crng.standard_normal((1, (hq + 2 * hkv) * d), dtype=cupy.float32) for _ in range(sets)]
    qs = [cupy.empty((1, hq, d), dtype=cupy.float32) for _ in range(sets)]
    outs = [cupy.empty((1, hq, d), dtype=cupy.float32) for _ in range(sets)]
    qk_w = (1 + 0.1 * crng.standard_normal(d, dtype=cupy.float32)) if qk_norm else None
    table, seq_lens, tok_seq, pos, cells, work = decode_token_inputs(GRAPH_TABLE, ctx, hq, d)

    def launch(i, attn=None):
        k_pool, v_pool = pools[i]
        q = ops.prepare_qkv_(qkvs[i], k_pool, v_pool, cells, pos, hq, hkv, qk_w, qk_w, 1e-6, 1e6, True, out=qs[i])
        if attn is not None:
            ops.attention(q, k_pool, v_pool, table, seq_lens, tok_seq, pos, d ** -0.5, workspace=work, q8=True,
                          out=outs[i], **attn)
    return launch, sets, outs


def graph_case(name: str, ctx: int, launches: int, reps: int, pdl: bool = True) -> dict:
    """prepare_qkv_ + attention of one decode token in a PDL graph; the attention's marginal µs."""
    import cupy
    _, hkv, d, _ = GRAPH_SHAPES[name]
    launch, sets, outs = graph_chain(name, ctx)
    splits = n_splits(hkv, GRAPH_TABLE, sm_count(), MMA_TILE)
    row = dict(shape=name, context=ctx, table=GRAPH_TABLE, pdl=pdl, splits=splits,
               cluster=mma_cluster(d, 1, MMA_DEPTH, splits), prepare_us=None, attention_us={}, nmse_vs_global={})
    with overlapped(pdl):
        row["prepare_us"] = base = graph_time_us(launch, sets, launches, reps)
        ref = None
        for v, kw in graph_variants(d, splits).items():
            row["attention_us"][v] = graph_time_us(lambda i, kw=kw: launch(i, kw), sets, launches, reps) - base
            cupy.cuda.Device().synchronize()
            got = outs[0].copy()
            if v == "mma, global merge":
                ref = got
            row["nmse_vs_global"][v] = got
    for v, got in row["nmse_vs_global"].items():         # the same inputs (set 0, the last replay's)
        row["nmse_vs_global"][v] = float(cupy.mean((got - ref) ** 2) / cupy.mean(ref ** 2))
    print(f"graph {name:13s} ctx={ctx:<5d} table={GRAPH_TABLE} pdl={int(pdl)} | prepare_qkv_ {base:5.1f} us | "
          f"+ attention: " + ", ".join(f"{v} {t:5.2f} us" for v, t in row["attention_us"].items())
          + f" | {splits} splits, cluster {row['cluster']} | NMSE vs global merge: "
          + ", ".join(f"{v} {e:.1e}" for v, e in row["nmse_vs_global"].items()), flush=True)
    return row


def prompt_inputs(cupy, rng, t: int, hq: int, hkv: int, d: int):
    """One T-token prompt, causal over its own T cells (scattered; cell 0 unused), on the device:
    (q, k_pool, v_pool, cell_table, seq_lens, tok_seq, tok_pos, out)."""
    cells = t + 1
    k_pool, v_pool = random_pool(cupy, cells, hkv, d), random_pool(cupy, cells, hkv, d)
    table = cupy.asarray(rng.permutation(np.arange(1, cells)).astype(np.int32)[None, :])
    q = cupy.asarray(rng.normal(0, 1, (t, hq, d)).astype(np.float32))
    return (q, k_pool, v_pool, table, cupy.asarray([t], np.int32), cupy.zeros(t, np.int32),
            cupy.arange(t, dtype=cupy.int32), cupy.empty((t, hq, d), np.float32))


def torch_copy(torch, cupy, arr):
    """A torch tensor that owns a copy of the CuPy array `arr` (uint16 bf16 bits stay uint16), the
    copy finished: no device buffer is left shared between CuPy's memory pool and torch's allocator."""
    cupy.cuda.get_current_stream().synchronize()
    out = torch.from_dlpack(cupy.ascontiguousarray(arr)).clone()
    torch.cuda.synchronize()
    return out


def sdpa_prefill(torch, cupy, q, k_pool, v_pool, table, scale: float):
    """PyTorch's causal SDPA on contiguous bf16 copies of one prompt's q and K/V (prompt_inputs'):
    (a launch(i) on the current CuPy stream, its output as (T, q_heads, D) float32)."""
    import torch.nn.functional as F
    dense = [torch_copy(torch, cupy, pool[table[0]].transpose(1, 0, 2)).view(torch.bfloat16)[None]
             for pool in (k_pool, v_pool)]                             # (1, kv heads, T, D)
    tq = torch_copy(torch, cupy, q).to(torch.bfloat16).permute(1, 0, 2)[None].contiguous()   # (1, q heads, T, D)

    def sdpa(i):
        with torch.cuda.stream(torch.cuda.ExternalStream(cupy.cuda.get_current_stream().ptr)):
            return F.scaled_dot_product_attention(tq, dense[0], dense[1], scale=scale, is_causal=True,
                                                  enable_gqa=True)
    torch.cuda.synchronize()
    out = sdpa(0).float()[0].permute(1, 0, 2)
    torch.cuda.synchronize()
    return sdpa, cupy.asarray(out.cpu().numpy())


def prefill_case(t: int, rng, launches: int, reps: int, torch, mma: bool, stages=(), rows_list=()) -> dict:
    """Causal attention of one T-token prompt over its own T cells (scattered), the run's heads:
    TFLOP/s counting the causal half (2 T^2 q_heads D multiply-adds), both kernels and SDPA
    (is_causal, contiguous bf16 copies) in the same run, and each against SDPA's output. stages,
    rows_list: the tensor-core kernel also at these pipeline depths and rows per block (each
    combination that exists; "mma" alone is mma_plan's rows and MMA_DEPTH)."""
    import cupy
    q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos, out = prompt_inputs(cupy, rng, t, HQ, HKV, D)
    scale = D ** -0.5
    flops = 2.0 * t * t * HQ * D                          # causal half of 2 matmuls of 2 flops per MAC
    cupy.cuda.Device().synchronize()
    row = {"prefill": t}
    results = {}
    variants = [("simt", {})] + ([("mma", {})] if mma else [])
    if mma and wgmma_runs(D, HQ // HKV, "wgmma"):   # the warpgroup kernel on Hopper, each depth and block
        wg_rows, wg_stages, _ = wgmma_plan(t, HQ // HKV, HKV, D, sm_count(), WGMMA_PRODUCER,
                                           WGMMA_PRODUCER and WGMMA_PERSISTENT)
        rule = (wg_stages, wg_rows, WGMMA_PRODUCER)     # the default route's: the "wgmma" row
        variants += [("wgmma", {})] + [(f"wgmma_r{r}_s{st}" + "_p" * p,
                                        dict(kernel="wgmma", force_rows=r, force_stages=st, force_producer=p))
                                       for d, st, r, p in WGMMA_VARIANTS if d == D and (st, r, p) != rule]
    if mma:
        for rows in rows_list or (None,):
            for st in stages or (None,):
                mw = mma_plan(t, 1, HQ // HKV, t, HKV, force_rows=rows)[0]
                if (rows or st) and (D, mw, st or MMA_DEPTH) in MMA_VARIANTS:
                    variants.append((f"mma_r{16 * mw}_s{st or MMA_DEPTH}",
                                     dict(kernel="mma", force_rows=rows, force_stages=st)))
    for kernel, kw in variants:
        kw = kw or dict(kernel=kernel)
        us = time_us(lambda i, kw=kw: ops.attention(q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos,
                                                    scale, out=out, **kw), 1, launches, reps)[0]
        results[kernel] = out.copy()
        row[f"{kernel}_us"], row[f"{kernel}_tflops"] = us, flops / us / 1e6
    if torch is not None:
        sdpa, ref = sdpa_prefill(torch, cupy, q, k_pool, v_pool, table, scale)
        us = time_us(sdpa, 1, launches, reps)[0]
        row["torch_us"], row["torch_tflops"] = us, flops / us / 1e6
        for kernel, got in results.items():
            row[f"{kernel}_nmse_vs_torch"] = nmse(cupy, got, ref)
    if mma:
        mw = mma_plan(t, 1, HQ // HKV, t, HKV)[0]
        row["mma_rule"] = f"{16 * mw} rows, {MMA_DEPTH} stages"
    print(f"attention prefill T={t:<5d} | " + " | ".join(
        f"{k}: {row[k + '_us']:9.1f} us {row[k + '_tflops']:6.1f} TFLOP/s" for k in [*results, "torch"]
        if k + "_us" in row) + (f" | mma = {row['mma_rule']}" if mma else "") + "".join(f" | {k} vs SDPA {row[k + '_nmse_vs_torch']:.1e}" for k in results
                                        if k + "_nmse_vs_torch" in row), flush=True)
    return row


def bf16_to_f32(xp, bits):
    """bfloat16 bits (uint16) -> float32, exactly."""
    return (bits.astype(xp.uint32) << 16).view(xp.float32)


def exact_rows(xp, q, k_pool, v_pool, table, rows, scale):
    """Float64 decode attention of the tokens in `rows` (token t reads all of table[t]; GQA as in the
    kernel: query head h uses kv head h // (q_heads // kv_heads)), on the same pools: an arbiter for
    the kernel-vs-SDPA cross-check that needs neither. xp: numpy or cupy. -> (len(rows), q_heads, D)."""
    hq = q.shape[1]
    hkv = k_pool.shape[1]
    out = []
    for t in rows:
        cells = table[t]
        k = bf16_to_f32(xp, k_pool[cells]).astype(xp.float64)          # (L, hkv, D)
        v = bf16_to_f32(xp, v_pool[cells]).astype(xp.float64)
        kk = xp.repeat(k, hq // hkv, axis=1)                           # (L, hq, D)
        vv = xp.repeat(v, hq // hkv, axis=1)
        s = xp.einsum("hd,lhd->hl", q[t].astype(xp.float64), kk) * scale
        p = xp.exp(s - s.max(axis=1, keepdims=True))
        out.append(xp.einsum("hl,lhd->hd", p, vv) / p.sum(axis=1)[:, None])
    return xp.stack(out)


def nmse(xp, got, ref):
    """Mean squared error over the reference's mean square, in float64; nan where either side holds a
    non-finite value, inf where the reference is all zeros (an output that was never computed)."""
    got, ref = xp.asarray(got, dtype=xp.float64), xp.asarray(ref, dtype=xp.float64)
    if not (bool(xp.isfinite(got).all()) and bool(xp.isfinite(ref).all())):
        return float("nan")
    den = float((ref ** 2).mean())
    return float(((got - ref) ** 2).mean()) / den if den > 0 else float("inf")


def sdpa_backend(torch, call) -> str:
    """The backend SDPA's default dispatch ran for `call`, named from the kernels the profiler saw
    (cuDNN's, flash's, the memory-efficient one's, or else the math path's matmuls)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    names = " ".join(e.name.lower() for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    for key, name in (("cudnn", "cuDNN"), ("flash", "flash"), ("fmha", "memory-efficient"),
                      ("efficient", "memory-efficient")):               # cuDNN's names hold "flash" too
        if key in names:
            return f"backend {name}"
    return "backend math" if names else "backend unknown (no kernel seen)"


def torch_case(torch, k_pool, v_pool, tables, qs, outs, sets, b, ctx, scale, launches, reps, kv_bytes, rows, exact):
    """SDPA on contiguous (B, 8, ctx, 128) bf16 copies of the same K/V, one query per sequence."""
    import cupy
    import torch.nn.functional as F
    tsets = min(sets, 4) if kv_bytes < (1 << 30) else 1
    ks, vs, tq = [], [], []
    for i in range(tsets):
        for pool, dst in ((k_pool, ks), (v_pool, vs)):
            dense = pool[tables[i]].transpose(0, 2, 1, 3)          # (B, ctx, 8, D) -> (B, 8, ctx, D)
            dst.append(torch_copy(torch, cupy, dense).view(torch.bfloat16))
            del dense
        tq.append(torch_copy(torch, cupy, qs[i]).to(torch.bfloat16).view(b, HQ, 1, D))

    def sdpa(i):
        with torch.cuda.stream(torch.cuda.ExternalStream(cupy.cuda.get_current_stream().ptr)):
            return F.scaled_dot_product_attention(tq[i], ks[i], vs[i], scale=scale, enable_gqa=True)

    def sdpa_f32():
        """SDPA's output on set 0 as (B, q heads, D) float32, made on the same stream and copied
        through the host, so no device buffer is shared between torch's allocator and CuPy's."""
        with torch.cuda.stream(torch.cuda.ExternalStream(cupy.cuda.get_current_stream().ptr)):
            out = sdpa(0).float().reshape(b, HQ, D)
        torch.cuda.synchronize()
        return cupy.asarray(out.cpu().numpy())
    torch.cuda.synchronize()                               # q's bf16 copies (torch's stream)
    ref_c = sdpa_f32()
    vs_kernel = nmse(cupy, outs[0], ref_c)
    vs_exact = nmse(cupy, ref_c[rows], exact)
    backend = sdpa_backend(torch, lambda: sdpa(0))
    us, how = time_us(sdpa, tsets, launches, reps)
    return dict(torch_us=us, torch_gbps=kv_bytes / us / 1e3, torch_timing=how, nmse_vs_torch=vs_kernel,
                torch_nmse_vs_exact=vs_exact, torch_backend=backend)


def fits(b: int, ctx: int, torch) -> bool:
    """The pool (one set at these sizes), the dense copies for torch, and headroom."""
    import cupy
    free, _ = cupy.cuda.Device().mem_info
    need = b * ctx * HKV * D * 4 * (3 if torch is not None else 1)
    return need < 0.8 * free


# SDPA's output against the exact rows above this NMSE: its time in the table is marked, as of a run
# whose output was not attention's
SDPA_CHECK_NMSE = 1e-3


def markdown(meta, rows) -> str:
    lines = [f"# attention decode — {meta['gpu']}, {meta['date']}, commit {meta['commit']}", "",
             ("Qwen3-8B geometry (32 q / 8 KV heads, head_dim 128, bf16 KV, " if meta.get("heads", [32, 8, 128]) == [32, 8, 128]
              else "{} q / {} KV heads, head_dim {} (bf16 KV, ".format(*meta["heads"]))
             + ("scattered cells" if meta.get("run_cells", 1) == 1 else f"cells in runs of {meta['run_cells']}")
             + "). "
             f"Copy bandwidth (D2D 1 GiB, read+write): {meta['copy_tbps']:.2f} TB/s, measured in this run."
             + "".join(f" Kernels built with -D{n}." for n in meta.get("defines", ())), "",
             "| batch | context | simt splits | simt µs | simt K+V TB/s | simt of copy | torch SDPA µs | torch TB/s "
             "| mma µs | stream µs (the default) | stream splits | stream of copy |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in (r for r in rows if "prefill" not in r):
        t = f"{r['torch_us']:.1f} | {r['torch_gbps'] / 1e3:.2f}" if r["torch_us"] else "– | –"
        if r["torch_us"] and not r["torch_nmse_vs_exact"] <= SDPA_CHECK_NMSE:     # nan and inf too
            t = t.replace(" |", f" (its output off: NMSE {r['torch_nmse_vs_exact']:.1e}) |", 1)
        lines.append(f"| {r['batch']} | {r['context']} | {r['splits']} | {r['us']:.1f} | {r['kv_gbps'] / 1e3:.2f} | "
                     f"{100 * r['of_copy']:.0f}% | {t} | " + (f"{r['mma_us']:.1f} |" if r.get("mma_us") else "– |")
                     + (f" {r['stream_us']:.1f} | {r['stream_splits']} | {100 * r['stream_of_copy']:.0f}% |"
                        if r.get("stream_us") else " – | – | – |"))
    swept = [r for r in rows if r.get("sweep")]
    if swept:
        lines += ["", "Split counts timed beside the rule (--splits), µs:", ""]
        lines += [f"- batch {r['batch']}, context {r['context']}, {sweep_label(r)}: "
                  + "; ".join(f"{s} splits {t:.1f}" for s, t in r["sweep"].items()) for r in swept]
    pre = [r for r in rows if "prefill" in r]
    if pre:
        lines += ["", "Causal prefill, one sequence (TFLOP/s count the causal half):", "",
                  "| T | simt µs | TFLOP/s | mma µs | TFLOP/s | wgmma µs | TFLOP/s | torch SDPA µs "
                  "| TFLOP/s | wgmma / SDPA |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in pre:
            cell = lambda k: f"{r[k + '_us']:.1f} | {r[k + '_tflops']:.1f}" if k + "_us" in r else "– | –"  # noqa: E731
            ratio = f"{r['wgmma_us'] / r['torch_us']:.2f}x" if "wgmma_us" in r and "torch_us" in r else "–"
            lines.append(f"| {r['prefill']} | {cell('simt')} | {cell('mma')} | {cell('wgmma')} | {cell('torch')} "
                         f"| {ratio} |")
    return "\n".join(lines) + "\n"


def use_placement(policy: str | None) -> None:
    """Place every later cluster launch's blocks by `policy` (a launch.CLUSTER_POLICIES name; None:
    the driver's default)."""
    launch.CLUSTER_POLICY = launch.CLUSTER_POLICIES[policy] if policy else None


def main(argv=None) -> int:
    global HQ, HKV, D
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--launches", type=int, default=50)
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    ap.add_argument("--splits", default="", help="comma-separated split counts to time beside the rule's")
    ap.add_argument("--sweep-cluster", type=int, default=None, metavar="C",
                    help="the cluster size --splits runs with (1: partials merged through global memory); "
                         "default the rule's for each split count")
    ap.add_argument("--sweep-kernel", default="simt", choices=("simt", "mma", "stream"),
                    help="the kernel --splits times")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--mma", action="store_true", help="time the tensor-core kernel (kernel='mma') beside")
    ap.add_argument("--stream", action="store_true", help="time the decode kernel (kernel='stream') beside")
    ap.add_argument("--prefill", default="", help="comma-separated prompt lengths for causal prefill cases")
    ap.add_argument("--stages", default="", help="with --mma or --stream: comma-separated pipeline depths (2,3,4) to "
                    "time the tensor-core kernels at, beside the rule's")
    ap.add_argument("--rows", default="", help="with --mma: comma-separated rows per prefill block (64,128) to time")
    ap.add_argument("--graph", action="store_true", help="time decode inside a PDL graph (prepare_qkv_ + "
                    "attention at contexts 600 and 1024 of a 1024-wide table; 8B, SmolLM2 and Gemma 3 shapes)")
    ap.add_argument("--no-pdl", action="store_true", help="with --graph: plain launches in the graph")
    ap.add_argument("--run-cells", type=int, default=1, help="decode: each sequence's cells come in runs of this "
                    "many consecutive cells, the runs scattered (1: every cell scattered)")
    ap.add_argument("--define", action="append", default=[], metavar="NAME",
                    help="compile every kernel with -DNAME=1 too (a source's switch, e.g. ATTN_MERGE_PULLED, for an A/B)")
    ap.add_argument("--heads", default=f"{HQ},{HKV},{D}", metavar="HQ,HKV,D",
                    help="query heads, kv heads and head dim of every case (default Qwen3-8B's; SmolLM2's 9,3,64)")
    ap.add_argument("--cluster-policy", choices=tuple(launch.CLUSTER_POLICIES),
                    help="place every cluster launch's blocks by this policy (default: no attribute, the driver's)")
    ap.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    args = ap.parse_args(argv)
    use_placement(args.cluster_policy)
    try:
        HQ, HKV, D = (int(x) for x in args.heads.split(","))
    except ValueError:
        ap.error(f"--heads: three integers q_heads,kv_heads,head_dim, got {args.heads!r}")
    import cupy
    from glimmer_cupy.kernels import build
    build.add_defines(*args.define)
    rng = np.random.default_rng(0)
    torch = None if args.no_torch else torch_or_none()
    copy_bw = copy_bandwidth()
    meta = run_meta(copy_tbps=copy_bw / 1e12, torch=None if torch is None else torch.__version__,
                    run_cells=args.run_cells, defines=args.define, heads=[HQ, HKV, D],
                    cluster_policy=args.cluster_policy or "driver default")
    print(f"# {meta['gpu']}: copy {copy_bw / 1e12:.2f} TB/s; torch {meta['torch']}")
    sweep = tuple(int(s) for s in args.splits.split(",")) if args.splits else ()
    stages = tuple(int(s) for s in args.stages.split(",")) if args.stages else ()
    rows_list = tuple(int(s) for s in args.rows.split(",")) if args.rows else ()
    rows = []
    graph_rows = []
    if args.graph:
        for name in GRAPH_SHAPES:
            for ctx in GRAPH_CONTEXTS:
                graph_rows.append(graph_case(name, ctx, args.launches, args.reps, not args.no_pdl))
    for ctx in (int(c) for c in args.contexts.split(",")):
        for b in (int(x) for x in args.batches.split(",") if int(x) > 0):
            if not fits(b, ctx, torch):
                print(f"attention decode B={b} ctx={ctx}: skipped, does not fit in device memory", flush=True)
                continue
            rows.append(run_case(b, ctx, rng, args.launches, args.reps, copy_bw, torch, sweep, args.mma, stages,
                                 args.run_cells, args.stream, args.sweep_kernel, args.sweep_cluster))
            cupy.get_default_memory_pool().free_all_blocks()        # the case's pools are gone
            if torch is not None:
                torch.cuda.empty_cache()
    for t in (int(x) for x in args.prefill.split(",")) if args.prefill else ():
        rows.append(prefill_case(t, rng, args.launches, args.reps, torch, args.mma, stages, rows_list))
        cupy.get_default_memory_pool().free_all_blocks()
    if args.out:
        if graph_rows:
            meta["graph"] = graph_rows
        write_results(args.out, meta, rows, markdown(meta, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
