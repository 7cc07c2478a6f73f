"""What the stamp probes share (probe_attention_decode.py, probe_attention_stream.py,
probe_decode_stamps.py): a module's stage stamps as an array, and the statistics they print."""

from __future__ import annotations

import numpy as np

STAMP_SHAPE = (4096, 10)        # cuda_src/stamps.cuh: kStampBlocks, kStamps


def module_stamps(module):
    """A module's glimmer_stamps (blocks, stages) of global-timer ns, in place on the device."""
    import cupy
    return cupy.ndarray(STAMP_SHAPE, np.uint64, module.get_global("glimmer_stamps"))


def print_stages(stamps: np.ndarray, t0: int, names, indent: str = "   ") -> None:
    """One line a stage: µs from t0 (ns) to the stamps (blocks, stages; 0: not reached), min / p10 /
    median / p90 / max over the blocks that reached it."""
    for i, name in enumerate(names):
        v = stamps[:, i]
        v = (v[v > 0] - t0) / 1e3
        if len(v):
            p10, med, p90 = np.percentile(v, (10, 50, 90))
            print(f"{indent}{i} {name:18s} n={len(v):4d} min {v.min():7.2f} p10 {p10:7.2f} med {med:7.2f} "
                  f"p90 {p90:7.2f} max {v.max():7.2f}", flush=True)
