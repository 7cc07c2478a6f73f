"""What each kernel of a one-token decode step pays for code its SM does not hold.

An SM holds little code (bench/probe_cold_code.py: 16 KB stayed, 64 KB did not), and a decode step
runs ~9 kernels a layer, each once, so a kernel may find its code gone by its next launch. This
probe records the launches of one one-token step (eager, plain launches: no PDL), then times each
kind of launch (kernel, grid, block) on its own, in CUDA graphs of R launches:
  warm  the launch R times back to back: its code stays in the SM when it fits;
  cold  an evictor (cold_chain<4096>, 64 KB of other code on every SM) before each launch, less a
        graph of the evictor alone: its code comes from L2 every time.
The data stays in L2 in both, so cold - warm is what the code costs a launch; times the launches
a step makes of that kind, it bounds what smaller code could save the step. Replays repeat a
kernel's side effects (an in-place residual add drifts), which changes no launch's shape.

    PYTHONPATH=$PWD python3 bench/probe_kernel_code.py -m SMOLLM2.gguf [--synthetic qwen3-8b] [--prompt 512]
    PYTHONPATH=$PWD python3 bench/probe_kernel_code.py -m random     # random weights, SmolLM2's shapes
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import glimmer_cupy.kernels.launch as launch  # noqa: E402
from glimmer_cupy.benchmarks.timing import graph_time_us, run_meta  # noqa: E402
from glimmer_cupy.kernels.build import get_kernel, sm_count  # noqa: E402

EVICTOR = "cold_chain<4096>"


class Recorder:
    """Every launch through launch.Kernel and launch_cluster while on: (key, replay function)."""

    def __init__(self):
        self.launches: list[tuple[tuple, object]] = []
        self._call, self._cluster = launch.Kernel.__call__, launch.launch_cluster
        # every loaded module of the package that holds launch_cluster under that name
        self._modules = [m for name, m in list(sys.modules.items()) if name.startswith("glimmer_cupy")
                         and getattr(m, "launch_cluster", None) is self._cluster]

    def __enter__(self):
        call, cluster, rec = self._call, self._cluster, self.launches

        def recorded_call(kern, grid, block, args, shared_mem=0):
            args = tuple(args)
            rec.append(((kern.name, tuple(grid), tuple(block)), lambda: call(kern, grid, block, args, shared_mem)))
            return call(kern, grid, block, args, shared_mem)

        def recorded_cluster(kern, grid, block, args, shared_mem, shape):
            args = tuple(args)
            rec.append(((kern.name, tuple(grid), tuple(block), tuple(shape)),
                        lambda: cluster(kern, grid, block, args, shared_mem, shape)))
            return cluster(kern, grid, block, args, shared_mem, shape)

        launch.Kernel.__call__ = recorded_call
        for module in self._modules:
            module.launch_cluster = recorded_cluster
        return self

    def __exit__(self, *exc):
        launch.Kernel.__call__ = self._call
        for module in self._modules:
            module.launch_cluster = self._cluster


def load(name: str):
    from glimmer_cupy.model.model import load_model
    if name == "random":
        from probe_decode_stack import random_smollm2
        name = random_smollm2()
    elif name.startswith("synthetic:"):
        from glimmer_cupy.weights.synthetic import cached_synthetic_gguf
        name = str(cached_synthetic_gguf(name.split(":", 1)[1]))
    else:
        from glimmer_cupy.weights.fetch import resolve_model
        name = str(resolve_model(name))
    return load_model(name)


def probe(label: str, model, prompt: int, reps: int, replays: int) -> dict:
    import cupy
    from probe_decode_stack import after_prompt

    ex, step = after_prompt(model, prompt)
    ex.logits(step)                                    # every kernel of the step compiled and run once
    ex.synchronize()
    with Recorder() as rec:
        ex.logits(step)
        ex.synchronize()
    kinds: OrderedDict[tuple, list] = OrderedDict()
    for key, fn in rec.launches:
        kinds.setdefault(key, []).append(fn)
    evict = get_kernel("cold_code_probe", EVICTOR, name_expressions=(EVICTOR,))
    blocks = sm_count()
    out, stamps = cupy.empty(blocks * 32, np.float32), cupy.zeros(2 * blocks, np.uint64)

    def evictor():
        evict((blocks,), (32,), (out, stamps, np.float32(0.999)))

    def timed(*fns) -> float:
        """µs a graph of `reps` rounds of fns takes, a round (graph_time_us: median of `replays`)."""
        return graph_time_us(lambda i: [f() for f in fns], 1, reps, replays)

    alone = timed(evictor)
    print(f"# {label}: {len(rec.launches)} launches in {len(kinds)} kinds; evictor alone "
          f"{alone:.2f} us; µs a launch, graphs of {reps}, median of {replays} replays", flush=True)
    print("| kernel | grid | block | a step | warm | cold | cold - warm | x a step |\n|---|---|---|---|---|---|---|---|")
    rows, total = [], 0.0
    for key, fns in kinds.items():
        fn = fns[0]
        warm = timed(fn)
        cold = timed(evictor, fn) - alone
        total += len(fns) * (cold - warm)
        rows.append(dict(kernel=key[0], grid=key[1], block=key[2], count=len(fns), warm_us=warm, cold_us=cold))
        print(f"| `{key[0][:60]}` | {key[1]} | {key[2]} | {len(fns)} | {warm:.2f} | {cold:.2f} | "
              f"{cold - warm:.2f} | {len(fns) * (cold - warm):.1f} |", flush=True)
    print(f"# {label}: the step's launches would pay {total:.1f} us for cold code (sum of count x (cold - warm))",
          flush=True)
    return dict(label=label, launches=len(rec.launches), evictor_us=alone, rows=rows, total_us=total)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", action="append", default=[], help="GGUF path, model name, or 'random'")
    ap.add_argument("--synthetic", action="append", default=[], help="a synthetic model, e.g. qwen3-8b")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--reps", type=int, default=20, help="launches a graph")
    ap.add_argument("--replays", type=int, default=15)
    ap.add_argument("--out", type=Path, help="write the results as JSON")
    a = ap.parse_args(argv)
    names = a.model + [f"synthetic:{s}" for s in a.synthetic]
    if not names:
        ap.error("name a model (-m) or a synthetic one (--synthetic)")
    results = {"meta": run_meta(), "models": []}
    for name in names:
        results["models"].append(probe(name, load(name), a.prompt, a.reps, a.replays))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
