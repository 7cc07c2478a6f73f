"""mma_dq's K-split rule (ops/matmul.py: mma_dq_config) against the one-wave rule (split K while
the launch stays within one wave of two blocks an SM, clusters of at most 8), which times faster
alone on 24576x4096 (bench/ab_mma_dq_splits.py), in a model's own decode step of several sequences
at once (batch 9..16 runs the matmuls at M = batch, Q4_K on mma_dq): the decode benchmark's GPU
step, alternating the rules in one process so the machine's drift shows beside the effect; also
the rule with at most 2 super-blocks a block (more, shorter blocks).
(The run at 887ae15, bench/results/ab_mma_dq_rule_887ae15.json, had the one-wave rule as the
library's, "previous" the rule that is the library's again, and a third arm with clusters of 16.)

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

WAVE = 2 * 132                      # blocks of one wave at two an SM on an H200


def one_wave(m: int, n: int, k: int) -> tuple[int, int]:
    """Splits double while the launch stays within one wave and each split keeps a super-block."""
    groups, nsb, ks = -(-n // matmul.MMA_DQ_BLOCK_ROWS), k // 256, 1
    while ks < 8 and 2 * ks <= nsb and groups * 2 * ks <= WAVE:
        ks *= 2
    return -(-m // 8), ks


def short_blocks(m: int, n: int, k: int) -> tuple[int, int]:
    """The rule with at most 2 super-blocks a block instead of 4 (more, shorter blocks)."""
    saved, matmul.MMA_DQ_SB_PER_BLOCK = matmul.MMA_DQ_SB_PER_BLOCK, 2
    try:
        return RULE(m, n, k)
    finally:
        matmul.MMA_DQ_SB_PER_BLOCK = saved


RULE = matmul.mma_dq_config
ARMS = {"rule": RULE, "one wave": one_wave, "short blocks": short_blocks}


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
    ap.add_argument("--arms", default="rule,one wave", help=f"comma-separated, of: {', '.join(ARMS)}")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the arms")
    ap.add_argument("--out", help="write the results as JSON")
    args = ap.parse_args()
    arms = [a.strip() for a in args.arms.split(",")]
    if not set(arms) <= set(ARMS):
        ap.error(f"--arms: each of {', '.join(ARMS)}, got {args.arms}")
    targets = [(m, resolve_model(m)) for m in args.model]
    targets += [(f"synthetic {name}", cached_synthetic_gguf(name)) for name in args.synthetic]
    results = {"meta": run_meta(), "batch": args.batch, "models": {}}
    rule = RULE
    try:
        for label, path in targets:
            model = load_model(path)
            got = []
            for _ in range(args.rounds):
                for name in arms:
                    matmul.mma_dq_config = ARMS[name]
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
