"""Time argmax and top-k/top-p sampling from logits on the GPU, against PyTorch in the same run.

For batch 1, 8, 64, 256 and vocab 49152 (SmolLM2), 151936 (Qwen3), 262144 (Gemma 3): logits
~ N(0, 3^2) float32, top-k 50, top-p 0.9, temperature 0.8. Each op is checked once against the
NumPy reference (first rows), then timed as a CUDA graph of many calls with CUDA events, median
of the repeats, logits rotated over copies so L2 does not hold the next call's (bench/common.py).
The baseline is PyTorch's usual composition, timed eagerly with torch's events on its stream:
softmax -> topk -> cumsum mask -> multinomial, and torch.argmax. Where the `flashinfer` package
imports (GPU.md: its sdist's folder on PYTHONPATH, JIT-built on first use), its
top_k_top_p_sampling_from_logits (top-k first, then top-p: our order) on the same logits divided
by the temperature beforehand and rotated over the same copies, as a torch CUDA graph of many
calls (eagerly where capture fails).
The logits read per call over the time gives GB/s beside the device-to-device copy bandwidth
measured in this run.

Verification (ops.sample_token with drafts): 16-token blocks, n = 15 drafts plus the bonus row, so
logits (rows, 16, vocab); rows 1, 8, 64. Greedy: drafts are the argmax for a random prefix, then
a wrong id. Stochastic (same parameters as above) with draft_probs q = softmax(logits / T) of a
perturbed copy of the logits, drafts = argmax(q). Floors: all logits + q bytes over the copy
bandwidth, and the bytes of the positions the rows examine (accepted + 1) the same way. PyTorch's
composition: softmax, gather p(d) and q(d), u < p/q, first rejection by cumprod, residual
clamp(p - q, 0) and multinomial (all positions at once), or argmax and compare for greedy. The
kernel examines every position of every row at once (one cluster of C blocks each, C printed)
and skips a position whose row already ended before it, so its time follows the examined bytes
and not the longest row's walk.

Our kernels launch with programmatic dependent launch inside the graphs (as the runtime's static
steps launch them; --pdl off for plain launches), so a call's launch overlaps the one before it.

    PYTHONPATH=$PWD python3 bench/bench_sampling.py [--quick] [--verify-only] [--pdl off] [--out bench/results/sampling.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy.benchmarks.timing import copy_bandwidth, n_sets, run_meta, time_us  # noqa: E402
from glimmer_cupy.kernels.launch import overlapped  # noqa: E402
from glimmer_cupy import ops  # noqa: E402
from glimmer_cupy.ops.sampling import DeviceSamplingParams  # noqa: E402
from glimmer_cupy.reference import sampling as ref  # noqa: E402

BATCHES = (1, 8, 64, 256)
VOCABS = (49152, 151936, 262144)
PARAMS = {"temperature": 0.8, "top_k": 50, "top_p": 0.9, "min_p": 0.0}


def torch_events_us(run, launches: int, reps: int) -> float:
    """Median over reps of (time of one run(), which makes `launches` calls) / launches, torch's
    events and stream."""
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / launches)
    return float(np.median(times))


def torch_warm(fn) -> None:
    """Three calls (compile, first touch), then wait for them."""
    import torch
    for _ in range(3):
        fn()
    torch.cuda.synchronize()


def torch_time_us(fn, launches: int, reps: int) -> float:
    """Median over reps of (time of `launches` eager calls) / launches, torch's events and stream."""
    torch_warm(fn)
    return torch_events_us(lambda: [fn() for _ in range(launches)], launches, reps)


def torch_graph_time_us(fn, launches: int, reps: int) -> tuple[float, str]:
    """(µs per call, "graph") from a torch CUDA graph of `launches` calls, or the eager figure and
    "eager" where the calls cannot be captured."""
    import torch
    torch_warm(fn)
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(launches):
                fn()
    except Exception:                                     # noqa: BLE001 (any capture failure: time eagerly)
        torch.cuda.synchronize()
        return torch_events_us(lambda: [fn() for _ in range(launches)], launches, reps), "eager"
    graph.replay()
    torch.cuda.synchronize()
    return torch_events_us(graph.replay, launches, reps), "graph"


def flashinfer_baseline(xs, launches: int, reps: int) -> dict:
    """FlashInfer's top-k/top-p sampling from logits on the same logit sets (rotated call by call as
    ours are), or {} where it does not import."""
    try:
        import flashinfer
        import torch
    except ImportError:
        return {}
    ts = [torch.from_dlpack(x) / PARAMS["temperature"] for x in xs]
    turn = iter(range(1 << 62))

    def call():
        flashinfer.sampling.top_k_top_p_sampling_from_logits(ts[next(turn) % len(ts)], PARAMS["top_k"],
                                                             PARAMS["top_p"], filter_apply_order="top_k_first")
    us, how = torch_graph_time_us(call, launches, reps)
    return {"flashinfer_sample_us": us, "flashinfer_timing": how,
            "flashinfer_version": getattr(flashinfer, "__version__", "unknown")}


def torch_baselines(x, launches: int, reps: int) -> dict:
    """PyTorch on the same logits (shared through DLPack), or {} where torch does not import."""
    try:
        import torch
    except ImportError:
        return {}
    t = torch.from_dlpack(x)
    t_args = torch.empty(t.shape[0], dtype=torch.int64, device=t.device)

    def sample():
        probs = torch.softmax(t / PARAMS["temperature"], dim=-1)
        top_v, top_i = torch.topk(probs, PARAMS["top_k"], dim=-1)           # sorted, descending
        mask = (top_v.cumsum(-1) - top_v) > PARAMS["top_p"]                 # keep the nucleus
        top_v = top_v.masked_fill(mask, 0.0)
        return top_i.gather(-1, torch.multinomial(top_v, 1))

    return {"torch_argmax_us": torch_time_us(lambda: torch.argmax(t, dim=-1, out=t_args), launches, reps),
            "torch_sample_us": torch_time_us(sample, max(3, launches // 10), reps)}


def run_case(batch: int, vocab: int, rng, launches: int, reps: int, copy_bw: float) -> dict:
    import cupy
    nbytes = batch * vocab * 4
    sets = n_sets(nbytes)
    host = (rng.normal(0, 3, (batch, vocab))).astype(np.float32)
    xs = [cupy.asarray(host)] + [cupy.asarray(rng.normal(0, 3, (batch, vocab)).astype(np.float32))
                                 for _ in range(sets - 1)]
    params = [ref.SamplingParams(**PARAMS, seed=1000 + r) for r in range(batch)]
    d = DeviceSamplingParams.from_params(params, vocab)
    positions = list(range(batch))
    pos = cupy.asarray(np.array(positions, np.int32))
    arg_out = cupy.empty(batch, np.int32)
    out = (cupy.empty(batch, np.int32), cupy.empty(batch, np.int32))

    # check: the first rows against the reference
    n = min(batch, 4)
    ok_arg = np.array_equal(cupy.asnumpy(ops.argmax(xs[0], out=arg_out))[:n], ref.argmax(host[:n]))
    got = cupy.asnumpy(ops.sample_rows(xs[0], d, pos, out=out)[0])[:n]
    ok_sample = np.array_equal(got, ref.sample_rows(host[:n], params[:n], positions[:n])[0])

    arg_us, arg_how = time_us(lambda i: ops.argmax(xs[i], out=arg_out), sets, launches, reps)
    smp_us, smp_how = time_us(lambda i: ops.sample_rows(xs[i], d, pos, out=out), sets, max(3, launches // 4), reps)
    long_us, _ = time_us(lambda i: ops.sample_rows(xs[i], d, pos, out=out, short_path=False), sets,
                         max(3, launches // 4), reps)
    row = {"batch": batch, "vocab": vocab, "argmax_us": arg_us, "sample_us": smp_us, "sample_long_path_us": long_us,
           "argmax_timing": arg_how,
           "sample_timing": smp_how, "argmax_gbps": nbytes / arg_us / 1e3, "sample_gbps": nbytes / smp_us / 1e3,
           "copy_gbps": copy_bw / 1e9, "check_argmax": ok_arg, "check_sample": ok_sample}
    row.update(torch_baselines(xs[0], launches, reps))
    row.update(flashinfer_baseline(xs, launches, reps))
    base = (f" | torch argmax {row['torch_argmax_us']:7.1f} us | torch softmax/topk/cumsum/multinomial "
            f"{row['torch_sample_us']:7.1f} us") if "torch_sample_us" in row else " | torch: not importable"
    if "flashinfer_sample_us" in row:
        base += f" | FlashInfer {row['flashinfer_sample_us']:7.1f} us ({row['flashinfer_timing']})"
    print(f"sampling B={batch:<3d} V={vocab:<6d} | argmax {arg_us:7.1f} us ({row['argmax_gbps']:6.0f} GB/s) | "
          f"top-k/top-p {smp_us:7.1f} us ({row['sample_gbps']:6.0f} GB/s, {smp_us / arg_us:4.2f}x argmax; "
          f"radix path {long_us:7.1f} us){base} | "
          f"check {'ok' if ok_arg and ok_sample else 'FAILED'}", flush=True)
    return row


VERIFY_ROWS = (1, 8, 64)
BLOCK = 16                                  # tokens per verified block: n = 15 drafts + the bonus


def torch_verify(x, q, d, greedy: bool, launches: int, reps: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    t, tq, td = torch.from_dlpack(x), torch.from_dlpack(q), torch.from_dlpack(d).long()

    def run():
        if greedy:
            ok = (t[:, :-1].argmax(-1) == td).int()
            return ok.cumprod(-1).sum(-1)
        p = torch.softmax(t / PARAMS["temperature"], dim=-1)
        pd = p[:, :-1].gather(-1, td[..., None])[..., 0]
        qd = tq.gather(-1, td[..., None])[..., 0]
        u = torch.rand_like(pd)
        acc = (u < pd / qd).int().cumprod(-1).sum(-1)
        r = (p[:, :-1] - tq).clamp_min_(0).flatten(0, 1)
        corr = torch.multinomial(r + 1e-20, 1)
        return acc, corr

    return torch_time_us(run, max(3, launches // 10), reps)


def verify_inputs(rows: int, vocab: int, greedy: bool, rng):
    """A verification case on the device: (logits, host parameters, positions, drafts, q or None)."""
    import cupy
    n = BLOCK - 1
    x = cupy.asarray(rng.normal(0, 3, (rows, BLOCK, vocab)).astype(np.float32))
    am = cupy.argmax(x[:, :n], axis=-1).astype(cupy.int32)
    pre = cupy.asarray(rng.integers(0, BLOCK, rows))                  # accepted prefix (greedy)
    drafts = cupy.where(cupy.arange(n)[None] < pre[:, None], am, (am + 1) % vocab).astype(cupy.int32)
    q = None
    if not greedy:
        z = (x[:, :n] + cupy.asarray(rng.normal(0, 1, (rows, n, vocab)).astype(np.float32))) / PARAMS["temperature"]
        q = cupy.exp(z - z.max(-1, keepdims=True))
        q /= q.sum(-1, keepdims=True)
        drafts = cupy.argmax(q, axis=-1).astype(cupy.int32)
    params = [ref.GREEDY if greedy else ref.SamplingParams(**PARAMS, seed=77 + r) for r in range(rows)]
    return x, params, list(range(0, 100 * rows, 100)), drafts, q


def run_verify_case(rows: int, vocab: int, greedy: bool, rng, launches: int, reps: int, copy_bw: float) -> dict:
    import cupy
    n = BLOCK - 1
    x, params, positions, drafts, q = verify_inputs(rows, vocab, greedy, rng)
    d = DeviceSamplingParams.from_params(params, vocab)
    pos = cupy.asarray(np.array(positions, np.int32))
    out = (cupy.empty(rows, np.int32), cupy.empty((rows, BLOCK), np.int32), cupy.empty(rows, np.int32))
    ops.sample_token(x, d, pos, drafts, q, out=out)
    want = ops.sample_token(cupy.asnumpy(x[:2]), params[:2], positions[:2], cupy.asnumpy(drafts[:2]),
                            None if q is None else cupy.asnumpy(q[:2]))
    ok = all(np.array_equal(cupy.asnumpy(o)[:2], w) for o, w in zip(out, want))
    accepted = float(cupy.asnumpy(out[0]).mean())
    us, how = time_us(lambda i: ops.sample_token(x, d, pos, drafts, q, out=out), 1, max(3, launches // 4), reps)
    all_bytes = x.nbytes + (0 if q is None else q.nbytes)
    seen = rows * (accepted + 1) * vocab * 4 * (1 if q is None else 2)
    from glimmer_cupy.ops import speculative as spec
    c, cache = spec.verify_shape(rows, n, vocab, spec._smem_budget(x.device.id), spec.sm_count())
    row = {"case": "verify", "mode": "greedy" if greedy else "stochastic+q", "rows": rows, "vocab": vocab,
           "block": BLOCK, "us": us, "timing": how, "mean_accepted": accepted,
           "max_accepted": int(cupy.asnumpy(out[0]).max()), "blocks_per_position": c, "cached_ids": cache,
           "floor_all_us": all_bytes / copy_bw * 1e6, "floor_examined_us": seen / copy_bw * 1e6, "check": ok}
    tv = torch_verify(x, q if q is not None else x[:, :n], drafts, greedy, launches, reps)
    if tv is not None:
        row["torch_us"] = tv
    base = f" | torch {tv:8.1f} us" if tv is not None else " | torch: not importable"
    print(f"verify {row['mode']:<12s} rows={rows:<3d} V={vocab:<6d} n={n} C={c} | {us:8.1f} us | mean accepted "
          f"{accepted:4.1f} (max {row['max_accepted']}) | floor all {row['floor_all_us']:6.1f} us, examined {row['floor_examined_us']:6.1f} us"
          f"{base} | check {'ok' if ok else 'FAILED'}", flush=True)
    return row


def markdown(meta: dict, rows: list[dict], vrows: list[dict]) -> str:
    """The rows as markdown tables (us; 'x' columns are ratios), with the run's GPU, date and commit."""
    def f(v, spec=".1f"):
        return "—" if v is None else format(v, spec)
    out = [f"# sampling — {meta['gpu']}, {meta['date']}, commit {meta['commit']}", "",
           f"Copy {meta['copy_tbps']:.2f} TB/s. Logits N(0, 9) float32; temperature {PARAMS['temperature']}, "
           f"top-k {PARAMS['top_k']}, top-p {PARAMS['top_p']}. CUDA graphs of many calls (PDL {meta.get('pdl', 'off')}), "
           "median; PyTorch eager.", ""]
    if rows:
        fi = [r for r in rows if "flashinfer_sample_us" in r]
        if fi:
            out += [f"FlashInfer {fi[0]['flashinfer_version']}: top_k_top_p_sampling_from_logits (top-k first), "
                    f"timed as a torch CUDA graph ({', '.join(sorted({r['flashinfer_timing'] for r in fi}))}).", ""]
        out += ["| batch | vocab | argmax | top-k/top-p | / argmax | radix path | torch argmax | torch composition "
                "| torch / ours | FlashInfer | FlashInfer / ours |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            ts, fs = r.get("torch_sample_us"), r.get("flashinfer_sample_us")
            out.append(f"| {r['batch']} | {r['vocab']} | {f(r['argmax_us'])} | {f(r['sample_us'])} | "
                       f"{f(r['sample_us'] / r['argmax_us'], '.2f')} | {f(r.get('sample_long_path_us'))} | "
                       f"{f(r.get('torch_argmax_us'))} | {f(ts)} | {f(ts / r['sample_us'] if ts else None, '.1f')} | "
                       f"{f(fs)} | {f(fs / r['sample_us'] if fs else None, '.1f')} |")
        out.append("")
    if vrows:
        out += ["| verify | rows | vocab | us | mean accepted | floor all | floor examined | torch |",
                "|---|---|---|---|---|---|---|---|"]
        for r in vrows:
            out.append(f"| {r['mode']} | {r['rows']} | {r['vocab']} | {f(r['us'])} | {f(r['mean_accepted'])} | "
                       f"{f(r['floor_all_us'])} | {f(r['floor_examined_us'])} | {f(r.get('torch_us'))} |")
        out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--launches", type=int, default=40)
    ap.add_argument("--quick", action="store_true", help="batch 1 and 64, vocab 151936 only")
    ap.add_argument("--verify-only", action="store_true", help="only the speculative verification cases")
    ap.add_argument("--no-verify", action="store_true", help="skip the speculative verification cases")
    ap.add_argument("--batches", default="", help="comma-separated batches (default: the sweep's)")
    ap.add_argument("--vocabs", default="", help="comma-separated vocabularies (default: the sweep's)")
    ap.add_argument("--out", type=Path, help="write the rows as JSON here")
    ap.add_argument("--pdl", choices=("on", "off"), default="on",
                    help="our kernels with programmatic dependent launch in the graphs (default on, as the runtime's)")
    args = ap.parse_args(argv)
    import cupy
    with overlapped(args.pdl == "on"):
        return run(args, cupy)


def run(args, cupy) -> int:
    rng = np.random.default_rng(0)
    copy_bw = copy_bandwidth()
    meta = run_meta(copy_tbps=copy_bw / 1e12, pdl=args.pdl, **PARAMS)
    print(f"# {meta['gpu']}: copy {copy_bw / 1e12:.2f} TB/s; logits ~ N(0, 9), "
          f"T={PARAMS['temperature']} top-k {PARAMS['top_k']} top-p {PARAMS['top_p']}")
    batches, vocabs = ((1, 64), (151936,)) if args.quick else (BATCHES, VOCABS)
    if args.batches:
        batches = tuple(int(b) for b in args.batches.split(","))
    if args.vocabs:
        vocabs = tuple(int(v) for v in args.vocabs.split(","))
    rows = []
    for v in vocabs if not args.verify_only else ():
        for b in batches:
            rows.append(run_case(b, v, rng, args.launches, args.reps, copy_bw))
            cupy.get_default_memory_pool().free_all_blocks()
    vrows = []
    for v in () if args.no_verify else (151936,) if args.quick else VOCABS:
        for b in (1, 64) if args.quick else VERIFY_ROWS:
            for greedy in (True, False):
                vrows.append(run_verify_case(b, v, greedy, rng, args.launches, args.reps, copy_bw))
                cupy.get_default_memory_pool().free_all_blocks()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"meta": meta, "rows": rows, "verify": vrows}, indent=1))
        args.out.with_suffix(".md").write_text(markdown(meta, rows, vrows))
    ok = all(r["check_argmax"] and r["check_sample"] for r in rows) and all(r["check"] for r in vrows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
