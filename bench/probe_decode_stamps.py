"""Where a decode step's time goes inside the model's own graph: every kernel compiled with
GLIMMER_STAMPS, the decode benchmark run once, then what its last graph replay left:

- the launch log (cuda_src/pdl.cuh): the moment each kernel's wait returned, which is when every
  kernel before it had completed. The time from one kernel's wait to the next one's is what that
  kernel adds to the step, its launch and overlap included; printed per kind of launch (source,
  grid, block, and the kind before it), count, median and total over the step;
- the stage stamps of prepare_qkv and decode attention (cuda_src/stamps.cuh; the last layer's:
  every launch of a kernel writes the same slots), in µs from prepare_qkv's wait returning (the qkv
  matmul done): min / p10 / median / p90 / max over the blocks that reach each stage.

    PYTHONPATH=$PWD python3 bench/probe_decode_stamps.py [-m MODEL ...] [--synthetic NAME ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import glimmer_cupy.kernels.build as build  # noqa: E402

build.add_defines("GLIMMER_STAMPS")
from stamp_stats import STREAM_STAGES, module_stamps, print_stages  # noqa: E402
_loaded: dict[tuple, object] = {}         # (source, defines, name expressions) -> module: each has its own log
_load = build._load


def _recording_load(name, defines, name_expressions):
    module = _load(name, defines, name_expressions)
    _loaded[(name, defines, name_expressions)] = module
    return module


build._load = _recording_load

STAGES = {
    "prepare_qkv": ("start", "waited", "done"),
    "attention_stream": STREAM_STAGES,
}


def stamps(module_name: str, blocks: int) -> np.ndarray | None:
    """(blocks, stages) global-timer ns of the module's last launch of `blocks` blocks (0: not
    reached); slots past those hold older, wider launches' stamps."""
    import cupy
    module = next((m for key, m in _loaded.items() if key[0] == module_name), None)
    if module is None:
        return None
    return cupy.asnumpy(module_stamps(module)).astype(np.int64)[:blocks]


def launch_log() -> list[tuple[int, str]]:
    """(ns, 'module grid block') of every logged launch still in the modules' rings, in time order."""
    import cupy
    rows = []
    for (name, _, _), module in _loaded.items():
        try:
            log = module.get_global("glimmer_log")
            n = int(cupy.ndarray((1,), np.uint32, module.get_global("glimmer_log_n")).get()[0])
        except Exception:               # a module without pdl.cuh
            continue
        entries = cupy.asnumpy(cupy.ndarray((4096, 3), np.uint64, log))[:min(n, 4096)]
        for t, g, b in entries.tolist():
            grid = (g & 0xFFFFFF, (g >> 24) & 0xFFFFF, g >> 44)
            block = (b & 0xFFFF, (b >> 16) & 0xFFFF, b >> 32)
            rows.append((int(t), f"{name} grid {'x'.join(map(str, grid))} block {'x'.join(map(str, block))}"))
    return sorted(rows)


def report_launches(label: str, rows) -> None:
    starts = [i for i, (_, what) in enumerate(rows) if what.startswith("embed ")]
    if not starts:
        print(f"{label}: no embed launch logged")
        return
    step = rows[starts[-1]:]
    kinds: dict[str, list[float]] = {}
    for i in range(len(step) - 1):
        before = step[i - 1][1].split()[0] if i else "-"
        kinds.setdefault(f"{step[i][1]} after {before}", []).append((step[i + 1][0] - step[i][0]) / 1e3)
    total = (step[-1][0] - step[0][0]) / 1e3
    print(f"{label}: {len(step)} launches logged, {total:.1f} µs from the embedding's wait to the last one's")
    print(f"  {'count':>5s} {'median µs':>9s} {'total µs':>9s}  launch")
    for what, ts in kinds.items():
        print(f"  {len(ts):5d} {np.median(ts):9.2f} {sum(ts):9.1f}  {what}")
    print(f"  {1:5d} {'-':>9s} {'-':>9s}  {step[-1][1]} (last logged; its end is not)")


def last_grid(rows, module_name: str) -> int:
    """Blocks of the module's last launch in the log `rows` (0: none)."""
    for _, what in reversed(rows):
        if what.startswith(module_name + " "):
            return int(np.prod([int(v) for v in what.split()[2].split("x")]))
    return 0


def report(label: str, rows) -> None:
    got = {name: stamps(name, last_grid(rows, name)) for name in STAGES}
    prep = got["prepare_qkv"]
    if prep is None:
        print(f"{label}: prepare_qkv did not run")
        return
    t0 = prep[prep[:, 1] > 0, 1].min()
    print(f"{label}: µs from prepare_qkv's wait returning")
    for name, names in STAGES.items():
        s = got[name]
        if s is None:
            print(f"  {name}: not run")
            continue
        used = s[:, 0] > 0
        print(f"  {name} ({int(used.sum())} blocks)")
        print_stages(s[used], t0, names, "     ")


def main() -> int:
    from glimmer_cupy.benchmarks.decode import bench_decode
    from glimmer_cupy.model.model import load_model
    from glimmer_cupy.weights.fetch import resolve_model
    from glimmer_cupy.weights.synthetic import cached_synthetic_gguf

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", action="append", default=[])
    ap.add_argument("--synthetic", action="append", default=[])
    args = ap.parse_args()
    targets = [(m, resolve_model(m)) for m in args.model]
    targets += [(f"synthetic {name}", cached_synthetic_gguf(name)) for name in args.synthetic]
    for label, path in targets:
        model = load_model(path)
        r = bench_decode(model, label, runs=1)
        print(f"{label}: GPU step {r.gpu_step_us:.1f} µs (with stamps)")
        rows = launch_log()
        report_launches(label, rows)
        report(label, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
