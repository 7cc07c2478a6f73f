"""`glimmer batch`: many prompts through the engine at once (runtime/engine.py: decode-first steps of
several sequences), one JSON line out per request as it finishes.

Input, one request a line (empty lines skipped): plain text is a prompt with the command line's
settings; a line starting with `{` is a JSON object with "prompt" and any of "n", "temperature",
"top_k", "top_p", "min_p", "seed", "chat", "system", "id", each overriding the command line for
that request.
Every line is checked before anything runs: a bad one is one error naming the file and line. A
request the engine cannot serve (longer than the context or the KV pool) comes back as an object
with "error", and the others still run. The engine keeps a prefix cache: a request admitted once
another has run the same leading tokens (a shared instruction, say) takes their K/V.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from .errors import GlimmerError
from .reference.sampling import SamplingParams

KEYS = {"prompt": str, "n": int, "temperature": (int, float), "top_k": int, "top_p": (int, float),
        "min_p": (int, float), "seed": int, "chat": bool, "system": str, "id": (str, int)}


@dataclass
class Line:
    """One request as read: where it came from and its settings (the command line's where unset)."""
    where: str
    prompt: str
    n: int
    params: SamplingParams
    chat: bool
    system: str | None                  # with chat: a system message before the prompt
    id: object


def read_lines(text: str, name: str, args, vocab: int | None, base_seed: int) -> list[Line]:
    """The requests of an input file's text, checked; GlimmerError naming the file and line. A
    request with no seed of its own gets --seed, or without one base_seed + its index."""
    out = []
    for no, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        where = f"{name}:{no}"
        fields: dict = {"prompt": raw}
        if raw.lstrip().startswith("{"):
            try:
                fields = json.loads(raw)
            except json.JSONDecodeError as e:
                raise GlimmerError(f"{where}: not a JSON object ({e.msg} at column {e.colno})") from None
            for key, value in fields.items():
                if key not in KEYS:
                    raise GlimmerError(f"{where}: unknown key {key!r}; known: {', '.join(KEYS)}")
                if not isinstance(value, KEYS[key]) or (isinstance(value, bool) and KEYS[key] is not bool):
                    raise GlimmerError(f"{where}: {key} must be {_kind(KEYS[key])}, got {value!r}")
            if "prompt" not in fields:
                raise GlimmerError(f"{where}: no \"prompt\"")
        n = fields.get("n", args.n)
        if n <= 0:
            raise GlimmerError(f"{where}: n must be > 0, got {n}")
        seed = fields.get("seed", args.seed if args.seed is not None else base_seed + len(out))
        try:
            params = SamplingParams(temperature=float(fields.get("temperature", args.temperature)),
                                    top_k=fields.get("top_k", args.top_k), top_p=float(fields.get("top_p", args.top_p)),
                                    min_p=float(fields.get("min_p", args.min_p)), seed=seed).check(vocab)
        except GlimmerError as e:
            raise GlimmerError(f"{where}: {e}") from None
        chat = fields.get("chat", args.chat)
        system = fields.get("system", args.system)
        if system is not None and not chat:
            raise GlimmerError(f"{where}: a system message needs chat (--chat, or \"chat\": true)")
        out.append(Line(where, fields["prompt"], n, params, chat, system, fields.get("id", len(out))))
    seen: dict = {}
    for line in out:
        if line.id in seen:
            raise GlimmerError(f"{line.where}: request id {line.id!r} is also {seen[line.id]}'s (a request "
                               "without one has its index among the requests)")
        seen[line.id] = line.where
    return out


def _kind(t) -> str:
    if t == (int, float):
        return "a number"
    names = {str: "a string", int: "an integer", bool: "true or false"}
    return " or ".join(names[x] for x in (t if isinstance(t, tuple) else (t,)))


def cmd_batch(args) -> int:
    from .cli import _executor, _open_model, _prompt_ids, _sampling, _say
    from .runtime.engine import Engine, host_pool_cells
    from .runtime.scheduler import Request

    if args.n <= 0:
        raise GlimmerError(f"-n must be > 0, got {args.n}")
    _sampling(args)                                   # reject bad arguments before reading or loading
    name = "<stdin>" if args.input == "-" else args.input
    try:
        text = sys.stdin.read() if args.input == "-" else Path(args.input).read_text(encoding="utf-8")
    except OSError as e:
        raise GlimmerError(f"{name}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise GlimmerError(f"{name}: not UTF-8 text") from None
    base_seed = int.from_bytes(os.urandom(4), "little")
    lines = read_lines(text, name, args, None, base_seed)          # before loading: the file's own errors
    if not lines:
        raise GlimmerError(f"{name}: no requests (every line is empty)")
    model, note, device = _open_model(args)
    requests = []
    for line in lines:
        try:
            line.params.check(model.cfg.vocab)
            ids = _prompt_ids(model, line.prompt, line.chat,
                              [{"role": "system", "content": line.system}] if line.system is not None else None)
        except GlimmerError as e:
            raise GlimmerError(f"{line.where}: {e}") from None
        requests.append(Request(ids, line.n, line.params, frozenset(model.tokenizer.eos_ids), line.id))
    executor, cuda_note = _executor(model, device, not args.no_graphs, not args.no_pdl, overlap=False,
                                    many_sequences=True)
    n_cells = executor.n_cells if executor is not None else host_pool_cells(len(r.prompt) + r.max_new
                                                                             for r in requests)
    _say(cuda_note or note)
    if args.seed is None and any(line.params.temperature > 0 for line in lines):
        _say(f"seed: {base_seed} + each request's index, where its line gives none")
    engine = Engine(model.decoder, n_cells, executor=executor, prefix_cache=True)
    by_id = {r.id: (i, r) for i, r in enumerate(requests)}
    rejected = 0
    # a bar on a terminal's stderr; the JSON lines on stdout either way
    bar = tqdm(total=len(requests), unit="req", file=sys.stderr, disable=not sys.stderr.isatty(), leave=False)
    for i, r in enumerate(requests):
        engine.add(r)
        res = engine.scheduler.results.get(r.id)
        if res is not None:                                 # rejected at add: too long for the context or pool
            rejected += 1
            _emit({"index": i, "id": r.id, "error": res.reason})
            bar.update()
    t0 = time.perf_counter()
    generated = 0
    while not engine.scheduler.idle:
        for res in engine.step():
            i, r = by_id[res.id]
            generated += len(res.tokens)
            _emit({"index": i, "id": res.id, "prompt_tokens": len(r.prompt), "tokens": res.tokens,
                   "text": model.tokenizer.decode(res.tokens), "stop_reason": res.stop_reason})
            bar.update()
    bar.close()
    seconds = time.perf_counter() - t0
    _say(f"batch: {len(requests)} requests ({rejected} rejected), {generated} tokens generated in {seconds:.2f} s, "
         f"{generated / seconds if seconds else 0.0:.1f} tok/s; {engine.cache.hits} prompt tokens from the "
         f"prefix cache; KV pool {n_cells} cells")
    return 0


def _emit(obj: dict) -> None:
    print(json.dumps(obj, ensure_ascii=False), flush=True)


def add_parser(sub, add_generation_args) -> None:
    p = sub.add_parser("batch", help="many prompts at once, one JSON line out per request")
    add_generation_args(p)
    p.add_argument("-i", "--input", default="-",
                   help="a file of requests, one a line (plain text prompts or JSON objects); default stdin")
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    p.add_argument("--system", default=None, help="with --chat: a system message before every prompt (the "
                   "requests then share its tokens, which the prefix cache computes once)")
    p.set_defaults(func=cmd_batch)
