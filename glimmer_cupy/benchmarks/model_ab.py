"""A/B of launch choices inside a model's own decode step.

A kernel's launch choice (splits, warps a row set, a launch bound, a pipeline depth) is tuned on a
graph of the same launch back to back; inside a decode step its neighbours are other kernels, and
the choice that wins alone can lose there (bench/results/NOTES.md, the thirtieth session: mma_dq's
K splits and gemv_kq's launch bound were ranked the other way in the model). Here each arm is a
set of module attributes to replace (a table, a constant, a rule function); every arm runs the
decode benchmark's GPU step (its captured graph replayed back to back, PDL on) on every model, the
arms alternating round after round in one process, so the machine's drift shows beside the effect.
The benchmark builds its executor, and so captures its graphs, after the arm is set.

bench/ab_*_model.py scripts name their arms and call `main`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

from .decode import bench_decode
from .timing import run_meta

# an arm: (module, attribute name) -> the value it takes while the arm runs
Arm = dict[tuple[object, str], object]


@contextlib.contextmanager
def applied(arm: Arm) -> Iterator[None]:
    """The arm's attributes set, and put back as they were on the way out."""
    saved = {key: getattr(*key) for key in arm}
    try:
        for (module, name), value in arm.items():
            setattr(module, name, value)
        yield
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)


def run_arms(targets: list[tuple[str, Path]], arms: dict[str, Arm], rounds: int,
             say: Callable[[str], None] = print, **bench) -> dict:
    """For each (label, gguf path): every arm in turn, `rounds` times; the GPU step of each run
    (`bench` goes to bench_decode: batch, prompt_tokens, gen_tokens, runs)."""
    from ..model.model import load_model
    results = {"meta": run_meta(), "bench": bench, "models": {}}
    for label, path in targets:
        model = load_model(path)
        got = []
        for _ in range(rounds):
            for name, arm in arms.items():
                with applied(arm):
                    us = bench_decode(model, label, **bench).gpu_step_us
                got.append({"arm": name, "gpu_step_us": us})
                say(f"{label:24s} {name:14s} GPU step {us:8.1f} us")
        results["models"][label] = {"layers": model.cfg.n_layers, "runs": got}
    return results


def main(doc: str, arms: dict[str, Arm], argv=None, batch: int = 1, prompt: int = 512, gen: int = 128) -> int:
    """The command line of a bench/ab_*_model.py script: models, arms by name, rounds, the decode
    benchmark's shape, a JSON file."""
    from ..weights.fetch import resolve_model
    from ..weights.synthetic import cached_synthetic_gguf

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=doc.split("\n\n", 1)[-1])
    ap.add_argument("-m", "--model", action="append", default=[], help="a GGUF path or model name (repeatable)")
    ap.add_argument("--synthetic", action="append", default=[], help="a synthetic model, e.g. qwen3-8b (repeatable)")
    ap.add_argument("--arms", default=",".join(arms), help=f"comma-separated, of: {', '.join(arms)}")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the arms")
    ap.add_argument("--runs", type=int, default=1, help="bench_decode runs an arm (the GPU step is its own median)")
    ap.add_argument("--batch", type=int, default=batch, help="sequences decoding together")
    ap.add_argument("--prompt", type=int, default=prompt, help="prompt tokens of each sequence")
    ap.add_argument("--gen", type=int, default=gen, help="tokens generated")
    ap.add_argument("--out", type=Path, help="write the results as JSON")
    a = ap.parse_args(argv)
    names = [n.strip() for n in a.arms.split(",")]
    unknown = [n for n in names if n not in arms]
    if unknown:
        ap.error(f"--arms: {', '.join(unknown)} not among {', '.join(arms)}")
    if not a.model and not a.synthetic:
        ap.error("name a model (-m) or a synthetic one (--synthetic)")
    targets = [(m, resolve_model(m)) for m in a.model]
    targets += [(f"synthetic {s}", cached_synthetic_gguf(s)) for s in a.synthetic]
    results = run_arms(targets, {n: arms[n] for n in names}, a.rounds,
                       say=lambda line: print(line, flush=True), batch=a.batch, prompt_tokens=a.prompt,
                       gen_tokens=a.gen, runs=a.runs)
    if a.out:
        a.out.write_text(json.dumps(results, indent=1))
    return 0
