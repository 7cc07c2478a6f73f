"""What the stamp probes share (probe_attention_decode.py, probe_attention_stream.py,
probe_decode_stamps.py): a module's stage stamps as an array, and the statistics they print."""

from __future__ import annotations

import numpy as np

STAMP_SHAPE = (4096, 16)        # cuda_src/stamps.cuh: kStampBlocks, kStamps
# attn_stream_kernel's stages (attention_stream.cu, attn_mma_end.cuh: STAMP(i) is stage i)
STREAM_STAGES = ("start", "early issued", "waited", "q smem", "tile0 landed", "tiles done", "rows/partials out",
                 "merged", "cluster met / last known", "own merge rows done", "merge weights", "merge staged",
                 "push announced", "warps' O stored", "row 0 merged", "rank 0 ready")


def module_stamps(module):
    """A module's glimmer_stamps (blocks, stages) of global-timer ns, in place on the device."""
    import cupy
    return cupy.ndarray(STAMP_SHAPE, np.uint64, module.get_global("glimmer_stamps"))


def block_spans(stamps: np.ndarray, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """(the blocks that reached stages a and b, each one's µs from a to b)."""
    both = (stamps[:, a] > 0) & (stamps[:, b] > 0)
    return both, (stamps[both, b].astype(np.float64) - stamps[both, a]) / 1e3


def spread(v: np.ndarray) -> str:
    """n, min / p10 / median / p90 / max of µs values."""
    p10, med, p90 = np.percentile(v, (10, 50, 90))
    return f"n={len(v):4d} min {v.min():7.2f} p10 {p10:7.2f} med {med:7.2f} p90 {p90:7.2f} max {v.max():7.2f}"


def module_smids(module):
    """A module's glimmer_smids (blocks,): the SM each block's stage 0 ran on, in place on the device."""
    import cupy
    return cupy.ndarray(STAMP_SHAPE[:1], np.uint32, module.get_global("glimmer_smids"))


def print_by_sm(stamps: np.ndarray, smids: np.ndarray, a: int, b: int, indent: str = "   ") -> None:
    """Each block's µs from stage a to stage b, averaged over the blocks of each SM, in SM order
    (blocks that reached both; '-' for an SM with none), then the mean by how many such blocks an SM
    ran: whether some SMs (or groups of them) stream slower than others."""
    both, span = block_spans(stamps, a, b)
    sm = smids[both].astype(np.int64)
    n_sm = int(sm.max()) + 1 if len(sm) else 0
    counts = np.bincount(sm, minlength=n_sm)
    means = np.bincount(sm, weights=span, minlength=n_sm) / np.maximum(counts, 1)
    print(f"{indent}stage {a} -> {b} by SM (µs, SM order): "
          + " ".join(f"{m:.1f}" if c else "-" for m, c in zip(means, counts)), flush=True)
    for c in sorted(set(counts[counts > 0])):
        print(f"{indent}  SMs with {c} block(s): {int((counts == c).sum())}, mean {means[counts == c].mean():.2f} us",
              flush=True)


def print_stages(stamps: np.ndarray, t0: int, names, indent: str = "   ") -> None:
    """One line a stage: µs from t0 (ns) to the stamps (blocks, stages; 0: not reached), min / p10 /
    median / p90 / max over the blocks that reached it."""
    for i, name in enumerate(names):
        v = stamps[:, i]
        v = (v[v > 0] - t0) / 1e3
        if len(v):
            print(f"{indent}{i} {name:18s} {spread(v)}", flush=True)


def print_spans(stamps: np.ndarray, names, pairs, indent: str = "   ") -> None:
    """One line a pair (a, b) of stages: each block's own µs from stage a to stage b, min / p10 /
    median / p90 / max over the blocks that reached both, and the correlation over blocks of the
    two stages' times (near 1: a block late at a is as late at b, the span is the same for all)."""
    for a, b in pairs:
        both, v = block_spans(stamps, a, b)
        if len(v) < 2:
            continue
        ta, tb = stamps[both, a].astype(np.float64), stamps[both, b].astype(np.float64)
        r = np.corrcoef(ta, tb)[0, 1] if ta.std() > 0 and tb.std() > 0 else float("nan")
        print(f"{indent}{names[a]} -> {names[b]}: {spread(v)} | corr {r:5.2f}", flush=True)
