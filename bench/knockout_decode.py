"""What each kind of kernel costs inside a model's own decode step: the decode benchmark's GPU step
(its captured graph replayed back to back, PDL on) with one kind of op at a time replaced by a
fixed output made once (no launch), against the step with everything.

    norms      add_rms_norm_ (two a layer)      silu       the gated activation (silu_mul / gelu_mul)
    attention  ops.attention                     prepare    prepare_qkv_ (q/k norm, RoPE, the K/V write)
    all        the four together: what is left is the matmuls, the embedding, the head and sampling

The tokens of a knocked-out step are meaningless; only its time counts. A kind's cost here is
what removing it saves in place, which is what fusing it away could at most save; bench_chain.py
measures the same on a synthetic chain of layers, whose figures need not carry over (a norm
costs 2.7 us there at Qwen3-8B's shapes and 1.1 us in the model).

    PYTHONPATH=$PWD python3 bench/knockout_decode.py --synthetic qwen3-8b [-m smollm2-135m] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import glimmer_cupy.ops as ops  # noqa: E402
from glimmer_cupy.benchmarks.decode import bench_decode  # noqa: E402
from glimmer_cupy.benchmarks.timing import run_meta  # noqa: E402
from glimmer_cupy.ops.q8 import Q8Rows  # noqa: E402

KINDS = {"norms": ("add_rms_norm_",), "silu": ("silu_mul", "gelu_mul"), "attention": ("attention",),
         "prepare": ("prepare_qkv_",)}
VARIANTS = ("everything", "norms", "silu", "attention", "prepare", "all")


def _fixed(cache: dict, shape, q8: bool):
    """A zero output of this shape (with zero codes for q8), made once and returned every call."""
    import cupy
    key = (tuple(shape), q8)
    if key not in cache:
        x = cupy.zeros(shape, cupy.float32)
        n = x.size // shape[0]
        cache[key] = Q8Rows(x, cupy.zeros((shape[0], n // 4), cupy.int32), cupy.zeros((shape[0], n // 32), cupy.float32),
                            cupy.zeros((shape[0], n // 32), cupy.float32)) if q8 else x
    return cache[key]


def _stand_ins(cache: dict) -> dict:
    """op name -> a function with the op's signature that launches nothing."""
    def codes(q8, n):
        return q8 and n % 32 == 0

    return {
        "add_rms_norm_": lambda r, d, w, eps, *, out=None, q8=False: _fixed(cache, r.shape, codes(q8, r.shape[-1])),
        "silu_mul": lambda gu, *, out=None, q8=False: _fixed(cache, (gu.shape[0], gu.shape[1] // 2), q8),
        "gelu_mul": lambda gu, *, out=None, q8=False: _fixed(cache, (gu.shape[0], gu.shape[1] // 2), q8),
        "attention": lambda q, *a, q8=False, **k: _fixed(cache, q.shape, q8),
        "prepare_qkv_": lambda qkv, kp, vp, cells, pos, nh, nkv, *a, **k: _fixed(cache, (qkv.shape[0], nh, kp.shape[-1]),
                                                                                 False),
    }


@contextlib.contextmanager
def knocked_out(variant: str):
    kinds = list(KINDS) if variant == "all" else [variant] if variant in KINDS else []
    names = [n for k in kinds for n in KINDS[k]]
    saved = {n: getattr(ops, n) for n in names}
    stand = _stand_ins({})
    for n in names:
        setattr(ops, n, stand[n])
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(ops, n, f)


def main() -> int:
    from glimmer_cupy.model.model import load_model
    from glimmer_cupy.weights.fetch import resolve_model
    from glimmer_cupy.weights.synthetic import cached_synthetic_gguf

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", action="append", default=[])
    ap.add_argument("--synthetic", action="append", default=[])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--define", action="append", default=[], metavar="NAME",
                    help="compile the kernels with -DNAME (to time a compile-time switch; every kernel then compiles afresh, "
                         "minutes on a cold machine)")
    ap.add_argument("--out", help="write the results as JSON")
    args = ap.parse_args()
    if args.define:
        import glimmer_cupy.kernels.build as build
        build.add_defines(*args.define)
    variants = args.variants.split(",")
    targets = [(m, resolve_model(m)) for m in args.model]
    targets += [(f"synthetic {name}", cached_synthetic_gguf(name)) for name in args.synthetic]
    results = {"meta": run_meta(defines=args.define), "models": {}}
    for label, path in targets:
        model = load_model(path)
        got = {}
        for v in variants:
            with knocked_out(v):
                got[v] = bench_decode(model, label, runs=args.runs).gpu_step_us
            saved = got.get("everything", got[v]) - got[v]
            print(f"{label:24s} {'without ' + v if v != 'everything' else v:18s} GPU step {got[v]:7.1f} us"
                  + (f"  ({saved:+.1f} us: {saved / model.cfg.n_layers:.2f} us a layer)" if v != "everything" else ""),
                  flush=True)
        results["models"][label] = {"layers": model.cfg.n_layers, "gpu_step_us": got}
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
