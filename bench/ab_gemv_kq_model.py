"""gemv_kq's launch choices at M = 1 (ops/matmul.py: kq_config's warps a row set, KQ_OCCUPANCY's
launch-bound kernel), measured alone on the H200 and tuned there, against neighbours of them in a
model's own one-token decode step: the decode benchmark's GPU step, alternating the arms in one
process so the machine's drift shows beside the effect. The arms:
  rule       the library's choices
  ws up      twice the warps a row set where the rule allows it (Qwen3-8B: gate/up 1 -> 2)
  ws down    half the warps a row set where the rule has more than one (q|k, o, down: 4 -> 2)
  occ off    the plain kernel where KQ_OCCUPANCY picks the launch-bound one (Q4_K at M = 1)
  occ layers the launch-bound kernel on every matrix of at most 256M weights (the rule at ff7da93:
             every layer of Qwen3-8B, no head)

    PYTHONPATH=$PWD python3 bench/ab_gemv_kq_model.py --synthetic qwen3-8b [--arms rule,ws up] [--out FILE]
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

RULE = matmul.kq_config


def ws_scaled(factor: float):
    def config(m: int, n: int, k: int, qtype=None) -> tuple[int, int]:
        rows, ws = RULE(m, n, k, qtype)
        if m == 1:
            ws = min(max(matmul.KQ_SPLITS), max(1, int(ws * factor)))
        return rows, ws
    return config


# name -> (kq_config, KQ_OCCUPANCY or None for the library's, KQ_OCC_WEIGHTS or None)
ARMS = {"rule": (RULE, None, None), "ws up": (ws_scaled(2), None, None), "ws down": (ws_scaled(0.5), None, None),
        "occ off": (RULE, {}, None), "occ layers": (RULE, None, 1 << 28)}


def main() -> int:
    from glimmer_cupy.model.model import load_model
    from glimmer_cupy.weights.fetch import resolve_model
    from glimmer_cupy.weights.synthetic import cached_synthetic_gguf

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", action="append", default=[])
    ap.add_argument("--synthetic", action="append", default=[])
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of: {', '.join(ARMS)}")
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the arms")
    ap.add_argument("--out", help="write the results as JSON")
    args = ap.parse_args()
    arms = [a.strip() for a in args.arms.split(",")]
    if not set(arms) <= set(ARMS):
        ap.error(f"--arms: each of {', '.join(ARMS)}, got {args.arms}")
    targets = [(m, resolve_model(m)) for m in args.model]
    targets += [(f"synthetic {name}", cached_synthetic_gguf(name)) for name in args.synthetic]
    results = {"meta": run_meta(), "models": {}}
    occupancy, edge = matmul.KQ_OCCUPANCY, matmul.KQ_OCC_WEIGHTS
    try:
        for label, path in targets:
            model = load_model(path)
            got = []
            for _ in range(args.rounds):
                for name in arms:
                    config, occ, weights = ARMS[name]
                    matmul.kq_config = config
                    matmul.KQ_OCCUPANCY = occupancy if occ is None else occ
                    matmul.KQ_OCC_WEIGHTS = edge if weights is None else weights
                    us = bench_decode(model, label, gen_tokens=args.gen, runs=args.runs).gpu_step_us
                    got.append({"arm": name, "gpu_step_us": us})
                    print(f"{label:24s} {name:8s} GPU step {us:8.1f} us", flush=True)
            results["models"][label] = {"layers": model.cfg.n_layers, "runs": got}
    finally:
        matmul.kq_config, matmul.KQ_OCCUPANCY, matmul.KQ_OCC_WEIGHTS = RULE, occupancy, edge
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
