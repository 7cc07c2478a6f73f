"""What asking the next GEMV's weights into L2 during a decode step's short kernels saves: the decode
benchmark's GPU step (its captured graph replayed back to back, PDL on) under several prefetch
tables (model/decoder.py's L2_PREFETCH, bytes by window), each against the step with none, in one
process and alternated (off, a table, off, ...), so the machine's drift shows beside the effect.

    PYTHONPATH=$PWD python3 bench/ab_l2_prefetch.py --synthetic qwen3-8b [-m smollm2-135m] [--out FILE]
    variants: off, or attention=MB,norm=MB,act=MB[,delay=NS] (unnamed windows 0)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import glimmer_cupy.model.decoder as decoder  # noqa: E402
import glimmer_cupy.ops as ops  # noqa: E402
from glimmer_cupy.benchmarks.decode import bench_decode  # noqa: E402
from glimmer_cupy.benchmarks.timing import run_meta  # noqa: E402

DEFAULT_VARIANTS = ("off", "attention=16,norm=6,act=6", "off", "attention=16", "attention=16,norm=12,act=12",
                    "attention=16,norm=6,act=6,delay=1500")


def parse(variant: str) -> tuple[dict, int]:
    """(window -> bytes, delay in ns) of a variant."""
    table = dict.fromkeys(decoder.L2_PREFETCH, 0)
    delay = 0
    if variant != "off":
        for item in variant.split(","):
            name, value = item.split("=")
            if name == "delay":
                delay = int(value)
            elif name in table:
                table[name] = int(float(value) * (1 << 20))
            else:
                raise SystemExit(f"ab_l2_prefetch: unknown window {name!r} (windows: {', '.join(table)}, delay)")
    return table, delay


def main() -> int:
    from glimmer_cupy.model.model import load_model
    from glimmer_cupy.weights.fetch import resolve_model
    from glimmer_cupy.weights.synthetic import cached_synthetic_gguf

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", action="append", default=[])
    ap.add_argument("--synthetic", action="append", default=[])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--variants", default=";".join(DEFAULT_VARIANTS), help="semicolon-separated")
    ap.add_argument("--out", help="write the results as JSON")
    args = ap.parse_args()
    variants = args.variants.split(";")
    for v in variants:
        parse(v)
    targets = [(m, resolve_model(m)) for m in args.model]
    targets += [(f"synthetic {name}", cached_synthetic_gguf(name)) for name in args.synthetic]
    results = {"meta": run_meta(), "models": {}}
    saved_table, plain = dict(decoder.L2_PREFETCH), ops.prefetch_l2
    try:
        for label, path in targets:
            model = load_model(path)
            got = []
            for v in variants:
                table, delay = parse(v)
                decoder.L2_PREFETCH.update(table)
                ops.prefetch_l2 = (lambda t, b, _d=delay: plain(t, b, _d)) if delay else plain
                us = bench_decode(model, label, runs=args.runs).gpu_step_us
                got.append({"variant": v, "gpu_step_us": us})
                print(f"{label:24s} {v:44s} GPU step {us:7.1f} us", flush=True)
            results["models"][label] = {"layers": model.cfg.n_layers, "runs": got}
    finally:
        decoder.L2_PREFETCH.update(saved_table)
        ops.prefetch_l2 = plain
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
