"""mma_dq's K-split rule (ops/matmul.py: mma_dq_config, one wave at two blocks an SM) against the rule
before it (at most 4 super-blocks a block, at least 132 blocks, clusters of at most 8), in a model's
own decode step of several sequences at once (batch 9..16 runs the matmuls at M = batch, Q4_K on
mma_dq): the decode benchmark's GPU step, alternating the two rules in one process so the
machine's drift shows beside the effect.

    PYTHONPATH=$PWD python3 bench/ab_mma_dq_rule.py --synthetic qwen3-8b [--batch 16] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import glimmer_cupy.ops.matmul as matmul  # noqa: E402
from glimmer_cupy.benchmarks.decode import bench_decode  # noqa: E402
from glimmer_cupy.benchmarks.timing import run_meta  # noqa: E402


def previous_rule(m: int, n: int, k: int) -> tuple[int, int]:
    """mma_dq_config before the one-wave rule."""
    groups, nsb, ks = -(-n // matmul.MMA_DQ_BLOCK_ROWS), k // 256, 1
    while ks < 8 and 2 * ks <= nsb and (-(-nsb // ks) > 4 or groups * ks < 132):
        ks *= 2
    return -(-m // 8), ks


def capped(m: int, n: int, k: int) -> tuple[int, int]:
    """The one-wave rule with clusters of at most 8 (no 16-block cluster)."""
    saved, matmul.MMA_DQ_MAX_SPLITS = matmul.MMA_DQ_MAX_SPLITS, 8
    try:
        return RULE(m, n, k)
    finally:
        matmul.MMA_DQ_MAX_SPLITS = saved


RULE = matmul.mma_dq_config


def main() -> int:
    from glimmer_cupy.model.model import load_model
    from glimmer_cupy.weights.fetch import resolve_model
    from glimmer_cupy.weights.synthetic import cached_synthetic_gguf

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", action="append", default=[])
    ap.add_argument("--synthetic", action="append", default=[])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2, help="(rule, rule capped at 8, previous rule) rounds")
    ap.add_argument("--out", help="write the results as JSON")
    args = ap.parse_args()
    targets = [(m, resolve_model(m)) for m in args.model]
    targets += [(f"synthetic {name}", cached_synthetic_gguf(name)) for name in args.synthetic]
    results = {"meta": run_meta(), "batch": args.batch, "models": {}}
    rule = RULE
    try:
        for label, path in targets:
            model = load_model(path)
            got = []
            for _ in range(args.rounds):
                for name, fn in (("one wave", rule), ("<= 8", capped), ("previous", previous_rule)):
                    matmul.mma_dq_config = fn
                    us = bench_decode(model, label, prompt_tokens=args.prompt, gen_tokens=args.gen, runs=args.runs,
                                      batch=args.batch).gpu_step_us
                    got.append({"rule": name, "gpu_step_us": us})
                    print(f"{label:24s} batch {args.batch} {name:9s} GPU step {us:8.1f} us", flush=True)
            results["models"][label] = {"layers": model.cfg.n_layers, "runs": got}
    finally:
        matmul.mma_dq_config = rule
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
