"""The `glimmer` command: run, chat, batch, info, fetch, bench."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter

from .errors import GlimmerError
from .reference.sampling import SamplingParams
from .runtime.generate import check_lengths
from .weights.fetch import DEFAULT_MODEL, MODELS, fetch, resolve_model


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line, with exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _sampling(args, vocab: int | None = None) -> SamplingParams:
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          min_p=args.min_p, seed=seed).check(vocab)


def _open_model(args):
    """(model, note on the device, device) — the note is printed only once all input has been
    checked; device is 'cpu' or 'cuda' (the executor is made by _executor, after the checks)."""
    from .model.model import load_model
    from .runtime.device import pick_device

    device = pick_device(args.device)
    model = load_model(resolve_model(args.model))
    note = "device: cpu (NumPy reference path)"
    if device == "cuda":
        from .runtime.cuda_executor import check_cuda_support
        try:
            check_cuda_support(model.cfg, model.weights)
        except GlimmerError as e:
            if args.device == "cuda":
                raise
            device, note = "cpu", f"device: cpu (NumPy reference path; a CUDA device is present, but {e})"
    return model, note, device


def _executor(model, device: str, graphs: bool = True, pdl: bool = True, overlap: bool = True,
              many_sequences: bool = False):
    """(executor or None for the NumPy path, note): the CUDA executor uploads the weights once and
    sizes its KV pool from the free memory, up to one full context (or, many_sequences, for the
    engine, up to its own cap)."""
    from .runtime.generate import make_executor

    ex = make_executor(model, device, graphs=graphs, pdl=pdl, overlap=overlap, many_sequences=many_sequences)
    if ex is None:
        return None, None
    from .runtime.cuda_executor import device_name
    return ex, (f"device: cuda ({device_name()}; weights {ex.weight_bytes / 2**20:.0f} MiB, KV pool "
                f"{ex.n_cells} cells, {ex.pool_bytes / 2**20:.0f} MiB; CUDA graphs {'on' if ex.graphs else 'off'}, "
                f"PDL {'on' if ex.pdl else 'off'}, overlapped steps {'on' if ex.overlap else 'off'})")


def _prompt_ids(model, text: str, chat: bool, history: list[dict] | None = None) -> list[int]:
    from .model.chat import encode_chat

    if not chat:
        return model.tokenizer.encode(text)
    if model.chat_template is None:
        raise GlimmerError(f"{model.path}: the model has no chat template; run without --chat")
    return encode_chat(model.tokenizer, model.chat_template, (history or []) + [{"role": "user", "content": text}])


def _generate_text(model, ids: list[int], args, params, stream: bool, executor=None, session=None):
    from .runtime.generate import GenerationStats, generate

    stats = GenerationStats()
    out: list[int] = []
    dec = model.tokenizer.stream()
    for t in generate(model, ids, args.n, params, stop_ids=model.tokenizer.eos_ids, stats=stats,
                      executor=None if session is not None else executor, session=session):
        out.append(t)
        if stream and t not in model.tokenizer.eos_ids:
            sys.stdout.write(dec.push(t))
            sys.stdout.flush()
    if stream:
        sys.stdout.write(dec.flush() + "\n")
        sys.stdout.flush()
    pf, gen = stats.rates()
    reused = f" ({stats.reused_tokens} already computed)" if stats.reused_tokens else ""
    _say(f"prompt: {stats.prompt_tokens} tokens{reused}, {pf:.1f} tok/s | generated: {stats.generated_tokens} "
         f"tokens, {gen:.1f} tok/s | stop: {stats.stop_reason}")
    if stats.flagged_rows:
        _say(f"warning: {stats.flagged_rows} steps had non-finite logits (took the argmax)")
    return out


def cmd_run(args) -> int:
    _sampling(args)                                   # reject bad arguments before loading
    if args.n <= 0:
        raise GlimmerError(f"-n must be > 0, got {args.n}")
    model, note, device = _open_model(args)
    params = _sampling(args, model.cfg.vocab)
    ids = _prompt_ids(model, args.prompt, args.chat)
    check_lengths(model, len(ids), args.n)
    executor, cuda_note = _executor(model, device, not args.no_graphs, not args.no_pdl, not args.no_overlap)
    _say(cuda_note or note)
    if args.seed is None and params.temperature > 0:
        _say(f"seed: {params.seed}")
    out = _generate_text(model, ids, args, params, stream=not args.json, executor=executor)
    if args.json:
        text = model.tokenizer.decode(out)
        print(json.dumps({"prompt_tokens": ids, "tokens": out, "text": text}, ensure_ascii=False))
    return 0


def cmd_chat(args) -> int:
    _sampling(args)
    if args.n <= 0:
        raise GlimmerError(f"-n must be > 0, got {args.n}")
    model, note, device = _open_model(args)
    params = _sampling(args, model.cfg.vocab)
    from .runtime.generate import Session

    executor, cuda_note = _executor(model, device, not args.no_graphs, not args.no_pdl, not args.no_overlap)
    _say(cuda_note or note)
    session = Session(model, executor)                 # each turn computes only what the last did not
    history: list[dict] = []
    if args.system:
        history.append({"role": "system", "content": args.system})
    _say("chat: one message per line; an empty line or end of input quits")
    for line in sys.stdin:
        text = line.rstrip("\n")
        if not text:
            break
        ids = _prompt_ids(model, text, True, history)
        out = _generate_text(model, ids, args, params, stream=True, session=session)
        history += [{"role": "user", "content": text},
                    {"role": "assistant", "content": model.tokenizer.decode(out)}]
    return 0


def cmd_info(args) -> int:
    from .model.config import ModelConfig
    from .weights.gguf_file import GGUFFile

    f = GGUFFile(resolve_model(args.model))
    by_type: Counter = Counter()
    count: Counter = Counter()
    n_params = 0
    for t in f.tensors.values():
        by_type[t.qtype.name] += t.nbytes
        count[t.qtype.name] += 1
        n = 1
        for d in t.shape:
            n *= d
        n_params += n
    print(f"file:          {f.path} ({f.file_size / 1e6:.1f} MB)")
    print(f"name:          {f.get('general.name', '?')}")
    print(f"architecture:  {f.architecture}")
    cfg = ModelConfig.from_gguf(f)
    print(f"parameters:    {n_params / 1e6:.1f} M")
    print(f"layers:        {cfg.n_layers}, hidden {cfg.hidden}, ffn {cfg.ffn}")
    print(f"attention:     {cfg.n_heads} query heads, {cfg.n_kv_heads} KV heads, head_dim {cfg.head_dim}"
          + (f", sliding window {cfg.sliding_window} on {sum(map(cfg.is_sliding, range(cfg.n_layers)))} layers"
             if cfg.sliding_window else ""))
    print(f"vocabulary:    {cfg.vocab}, context {cfg.context}, rope base {cfg.rope_base:g}"
          + (", tied output" if cfg.tied_output else ""))
    print("tensor bytes by type:")
    for name, b in sorted(by_type.items(), key=lambda kv: -kv[1]):
        print(f"  {name:6s} {count[name]:5d} tensors  {b / 1e6:10.2f} MB")
    return 0


def cmd_fetch(args) -> int:
    names = sorted(MODELS) if args.name == "all" else [args.name]
    for name in names:
        print(fetch(name))
    return 0


def _add_generation_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", default=DEFAULT_MODEL,
                   help=f"a GGUF path or a model name ({', '.join(sorted(MODELS))}); default {DEFAULT_MODEL}")
    p.add_argument("-n", type=int, default=64, help="tokens to generate (default 64)")
    p.add_argument("--temperature", type=float, default=0.8, help="0 is greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=40, help="0 is off (default 40)")
    p.add_argument("--top-p", type=float, default=0.95, help="1 is off (default 0.95)")
    p.add_argument("--min-p", type=float, default=0.0, help="0 is off (default 0)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: drawn and printed)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--no-graphs", action="store_true",
                   help="CUDA: run every step eagerly instead of replaying CUDA graphs (same tokens, slower)")
    p.add_argument("--no-pdl", action="store_true",
                   help="CUDA: launch each kernel after the one before it has finished (same tokens, slower)")
    p.add_argument("--no-overlap", action="store_true",
                   help="CUDA: launch each decode step only once the host has the previous token (same tokens, slower)")


def _check_bench_targets(args, what: str) -> None:
    """A benchmark's -m and --synthetic arguments name something (checked before any device or file work)."""
    from .weights.synthetic import CONFIGS

    if not args.model and not args.synthetic:
        raise GlimmerError(f"{what}: give a model (-m) or a synthetic one (--synthetic NAME)")
    bad = [s for s in args.synthetic if s not in CONFIGS]
    if bad:
        raise GlimmerError(f"{what}: unknown synthetic model {bad[0]!r}; choose from {', '.join(CONFIGS)}")


def _bench_targets(args) -> list[tuple[str, str]]:
    """(label, path) of each -m model and --synthetic one (written on first use)."""
    from .weights.synthetic import cached_synthetic_gguf

    targets = [(m, resolve_model(m)) for m in args.model]
    return targets + [(f"synthetic {name} Q4_K_M", cached_synthetic_gguf(name, _say)) for name in args.synthetic]


def cmd_bench_serve(args) -> int:
    from .benchmarks.serve import bench_serve, markdown
    from .benchmarks.timing import run_meta, write_results
    from .model.model import load_model
    from .runtime.device import pick_device
    from .runtime.engine import host_pool_cells
    from .runtime.generate import make_executor

    for n, v in (("--requests", args.requests), ("--prompt", args.prompt), ("--gen", args.gen)):
        if v < 1:
            raise GlimmerError(f"bench serve: {n} must be >= 1, got {v}")
    if not args.rate >= 0:
        raise GlimmerError(f"bench serve: --rate must be >= 0 requests a second (0: all at once), got {args.rate}")
    if not 0 <= args.shared <= args.prompt:
        raise GlimmerError(f"bench serve: --shared must be in [0, {args.prompt}] (the prompt), got {args.shared}")
    _check_bench_targets(args, "bench serve")
    device = pick_device(args.device)
    targets = _bench_targets(args)
    results = []
    for label, path in targets:
        model = load_model(path)
        if args.prompt + args.gen > model.cfg.context:
            raise GlimmerError(f"bench serve: {label}: prompt {args.prompt} + {args.gen} tokens exceed the "
                               f"context of {model.cfg.context}")
        ex = make_executor(model, device, graphs=not args.no_graphs, pdl=not args.no_pdl, overlap=False,
                           many_sequences=True)
        n_cells = ex.n_cells if ex is not None else host_pool_cells([args.prompt + args.gen] * args.requests)
        _say(f"{label}: {path} ({device}, KV pool {n_cells} cells)")
        for cache in ((True, False) if args.compare_cache else (not args.no_prefix_cache,)):
            r = bench_serve(model, label, ex, n_cells, args.requests, args.rate, args.prompt, args.shared, args.gen,
                            cache)
            s = r.summary()
            _say(f"  prefix cache {'on' if cache else 'off'}: {r.tok_s:,.1f} tok/s | TTFT median "
                 f"{s['ttft_median_ms']:.1f} ms, p90 {s['ttft_p90_ms']:.1f} | TPOT median {s['tpot_median_ms']:.2f} ms "
                 f"| {r.steps} steps, {r.cache_hits} prompt tokens from the cache")
            results.append(r)
    meta = run_meta(device=device, gpu=None if device == "cuda" else "no GPU (the NumPy path)")
    text = markdown(results, meta)
    print(text)
    if args.out:
        from pathlib import Path
        write_results(Path(args.out), meta, [r.summary() for r in results], text)
    return 0


def cmd_bench_decode(args) -> int:
    from .benchmarks.decode import bench_decode, markdown
    from .runtime.step_planner import MAX_STEP_TOKENS
    from .benchmarks.timing import run_meta, write_results
    from .model.model import load_model
    from .runtime.device import pick_device

    for n, v in (("--prompt", args.prompt), ("--gen", args.gen), ("--runs", args.runs)):
        if v < 1:
            raise GlimmerError(f"bench decode: {n} must be >= 1, got {v}")
    if args.prefill_chunk < 0:
        raise GlimmerError(f"bench decode: --prefill-chunk must be 0 (one step) or positive, got {args.prefill_chunk}")
    try:
        batches = [int(b) for b in args.batch.split(",")]
    except ValueError:
        raise GlimmerError(f"bench decode: --batch must be comma-separated integers, got {args.batch!r}") from None
    if min(batches) < 1 or max(batches) > MAX_STEP_TOKENS:
        bad = min(batches) if min(batches) < 1 else max(batches)
        raise GlimmerError(f"bench decode: --batch sizes must be in 1..{MAX_STEP_TOKENS} (one step), got {bad}")
    _check_bench_targets(args, "bench decode")
    pick_device("cuda")
    targets = _bench_targets(args)
    results = []
    for label, path in targets:
        model = load_model(path)
        if args.prompt + args.gen + 1 > model.cfg.context:
            raise GlimmerError(f"bench decode: {label}: prompt {args.prompt} + {args.gen} tokens exceed the "
                               f"context of {model.cfg.context}")
        _say(f"{label}: {path}")
        for b in batches:
            r = bench_decode(model, label, args.prompt, args.gen, args.runs, graphs=not args.no_graphs,
                             pdl=not args.no_pdl, prefill_chunk=args.prefill_chunk, batch=b,
                             overlap=not args.no_overlap,
                             profile=args.profile_step, progress=lambda m: _say(f"  {m}"))
            _say(f"  {b} sequence{'s' if b > 1 else ''}: prefill {r.prefill_tok_s:,.0f} tok/s | decode "
                 f"{r.decode_tok_s:,.1f} tok/s, {r.achieved_bandwidth / 1e9:,.0f} GB/s = {r.fraction_of_copy:.1%} of "
                 f"copy ({r.copy_bandwidth / 1e12:.2f} TB/s)")
            results.append(r)
    meta = run_meta(copy_bandwidth=results[0].copy_bandwidth)
    text = markdown(results, meta)
    print(text)
    if args.out:
        from pathlib import Path
        write_results(Path(args.out), meta, [r.summary() for r in results], text)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="glimmer", description="Run LLMs from GGUF files: CUDA kernels, NumPy reference path.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("run", help="generate text from a prompt")
    _add_generation_args(p)
    p.add_argument("-p", "--prompt", required=True)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("chat", help="multi-turn chat on standard input")
    _add_generation_args(p)
    p.add_argument("--system", default=None, help="a system message")
    p.set_defaults(func=cmd_chat)

    from .cli_batch import add_parser as add_batch_parser
    add_batch_parser(sub, _add_generation_args)

    p = sub.add_parser("info", help="architecture, sizes and tensor bytes by quant type")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("bench", help="measure the CUDA path")
    bench = p.add_subparsers(dest="what", required=True, parser_class=_Parser)
    p = bench.add_parser("decode", help="prefill and decode speed against the copy bandwidth (one or a batch of sequences)")
    p.add_argument("-m", "--model", action="append", default=[], help="a GGUF path or model name (repeatable)")
    p.add_argument("--synthetic", action="append", default=[],
                   help="a synthetic model written on this machine: qwen3-0.6b, qwen3-4b, qwen3-8b, ... (repeatable)")
    p.add_argument("--prompt", type=int, default=512, help="prompt tokens (default 512)")
    p.add_argument("--gen", type=int, default=128, help="tokens to generate (default 128)")
    p.add_argument("--runs", type=int, default=5, help="runs; the median is reported (default 5)")
    p.add_argument("--no-graphs", action="store_true", help="decode eagerly")
    p.add_argument("--no-pdl", action="store_true", help="launch kernels without programmatic dependent launch")
    p.add_argument("--no-overlap", action="store_true",
                   help="launch each decode step only once the previous step's tokens are on the host")
    p.add_argument("--batch", default="1",
                   help="sequences decoding together, comma-separated sizes to run (default 1)")
    p.add_argument("--prefill-chunk", type=int, default=0,
                   help="prefill in steps of this many tokens (64: the widest CUDA-graph step); 0: one step")
    p.add_argument("--profile-step", action="store_true",
                   help="run one more decode step between cudaProfilerStart/Stop (for ncu --profile-from-start off)")
    p.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    p.set_defaults(func=cmd_bench_decode)
    p = bench.add_parser("serve", help="the engine serving requests that arrive over time: tok/s, TTFT, TPOT")
    p.add_argument("-m", "--model", action="append", default=[], help="a GGUF path or model name (repeatable)")
    p.add_argument("--synthetic", action="append", default=[], help="a synthetic model written on this machine (repeatable)")
    p.add_argument("--requests", type=int, default=32, help="requests (default 32)")
    p.add_argument("--rate", type=float, default=0.0, help="arrivals a second, Poisson; 0: all at once (default)")
    p.add_argument("--prompt", type=int, default=256, help="prompt tokens of each request (default 256)")
    p.add_argument("--shared", type=int, default=0, help="of those, the leading ones every request shares (default 0)")
    p.add_argument("--gen", type=int, default=64, help="tokens each request generates (default 64)")
    p.add_argument("--no-prefix-cache", action="store_true", help="run the engine without its prefix cache")
    p.add_argument("--compare-cache", action="store_true", help="run with the prefix cache, then without")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--no-graphs", action="store_true", help="CUDA: run every step eagerly")
    p.add_argument("--no-pdl", action="store_true", help="CUDA: launch kernels without programmatic dependent launch")
    p.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    p.set_defaults(func=cmd_bench_serve)

    p = sub.add_parser("fetch", help="download a named model into the cache")
    p.add_argument("name", choices=sorted(MODELS) + ["all"])
    p.set_defaults(func=cmd_fetch)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except GlimmerError as e:
        _say(f"glimmer: error: {e}")
        return 2
    except RuntimeError as e:                         # a CUDA failure mid-generation: step, layer, op
        from .runtime.cuda_executor import CudaStepError
        if not isinstance(e, CudaStepError):
            raise
        _say(f"glimmer: CUDA error: {e}")
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
