"""`glimmer bench serve`: the engine serving requests that arrive over time (runtime/engine.py:
decode-first steps of many sequences over one KV pool, with its prefix cache), timed on the host.

Requests of `prompt` random tokens (the first `shared` of them the same in every request, as a
common instruction would be) each ask for `gen` tokens with no stop token, arriving as a Poisson
process of `rate` requests a second (seeded; rate 0: all at once). The engine steps whenever it has
work; between arrivals with nothing to run, the host waits for the next. Per request:
  - TTFT, time to first token: from its arrival to the step that sampled its first token;
  - TPOT, time per output token: from its first token to its last, over gen - 1.
Reported: the medians and 90th percentiles of both, aggregate generated tokens a second over the
run (first arrival to last token), steps run, and prompt tokens the prefix cache supplied.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import GlimmerError
from ..model.model import Model
from ..reference.sampling import GREEDY
from ..runtime.engine import Engine
from ..runtime.scheduler import Request


@dataclass
class ServeBench:
    model: str
    requests: int
    rate: float                         # arrivals a second (0: all at once)
    prompt_tokens: int
    shared_tokens: int
    gen_tokens: int
    prefix_cache: bool
    n_cells: int
    seconds: float = 0.0                # first arrival to last token
    generated: int = 0
    steps: int = 0
    cache_hits: int = 0                 # prompt tokens taken from the prefix cache
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        return self.generated / self.seconds if self.seconds else 0.0

    def summary(self) -> dict:
        d = asdict(self)
        for name in ("ttft_s", "tpot_s"):
            v = d.pop(name)
            d[f"{name[:4]}_median_ms"] = 1e3 * float(np.median(v)) if v else 0.0
            d[f"{name[:4]}_p90_ms"] = 1e3 * float(np.percentile(v, 90)) if v else 0.0
        d["tok_s"] = self.tok_s
        return d


def arrivals(n: int, rate: float, seed: int = 0) -> list[float]:
    """Seconds from the start at which each of n requests arrives: a Poisson process of `rate` a
    second (exponential gaps), the first at 0; all at 0 when rate is 0."""
    if rate <= 0:
        return [0.0] * n
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, n)
    gaps[0] = 0.0
    return np.cumsum(gaps).tolist()


def bench_serve(model: Model, name: str, executor, n_cells: int, requests: int = 32, rate: float = 0.0,
                prompt_tokens: int = 256, shared_tokens: int = 0, gen_tokens: int = 64, prefix_cache: bool = True,
                seed: int = 0, clock=time.perf_counter, sleep=time.sleep) -> ServeBench:
    """One run of the engine over the arrivals; executor None runs the NumPy path."""
    if not 0 <= shared_tokens <= prompt_tokens:
        raise GlimmerError(f"bench serve: --shared must be in [0, {prompt_tokens}] (the prompt), got {shared_tokens}")
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, model.cfg.vocab, shared_tokens).tolist()
    reqs = [Request(shared + rng.integers(0, model.cfg.vocab, prompt_tokens - shared_tokens).tolist(), gen_tokens,
                    GREEDY, frozenset(), id=i) for i in range(requests)]
    due = arrivals(requests, rate, seed)
    engine = Engine(model.decoder, n_cells, executor=executor, prefix_cache=prefix_cache)
    r = ServeBench(name, requests, rate, prompt_tokens, shared_tokens, gen_tokens, prefix_cache, n_cells)
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    t0 = clock()

    def on_token(rid, _tok):                          # called as the step's tokens come back
        now = clock() - t0
        first.setdefault(rid, now)
        last[rid] = now

    added = 0
    while added < requests or not engine.scheduler.idle:
        now = clock() - t0
        while added < requests and due[added] <= now:
            engine.add(reqs[added])
            added += 1
        if engine.scheduler.idle:
            sleep(max(0.0, due[added] - (clock() - t0)))
            continue
        engine.step(on_token)
        r.steps += 1
    for i in range(requests):
        res = engine.scheduler.results[i]
        if res.stop_reason == "rejected":
            raise GlimmerError(f"bench serve: {name}: request {i} was rejected: {res.reason}")
        r.generated += len(res.tokens)
        r.ttft_s.append(first[i] - due[i])
        if len(res.tokens) > 1:
            r.tpot_s.append((last[i] - first[i]) / (len(res.tokens) - 1))
    r.seconds = max(last.values())
    r.cache_hits = engine.cache.hits if engine.cache is not None else 0
    return r


def markdown(results: list[ServeBench], meta: dict) -> str:
    lines = [f"# glimmer bench serve — {meta['gpu']}, {meta['date']}, commit {meta['commit']}", "",
             "Requests arriving as a Poisson process (rate 0: all at once), greedy, no stop token; TTFT from "
             "arrival to first token, TPOT over the rest; tok/s = generated tokens / (first arrival to last "
             "token).", "",
             "| model | requests | rate /s | prompt (shared) | gen | prefix cache | tok/s | TTFT median / p90 ms "
             "| TPOT median / p90 ms | steps | cached prompt tokens |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        s = r.summary()
        lines.append(f"| {r.model} | {r.requests} | {r.rate:g} | {r.prompt_tokens} ({r.shared_tokens}) | {r.gen_tokens} "
                     f"| {'on' if r.prefix_cache else 'off'} | {r.tok_s:,.1f} | {s['ttft_median_ms']:.1f} / "
                     f"{s['ttft_p90_ms']:.1f} | {s['tpot_median_ms']:.2f} / {s['tpot_p90_ms']:.2f} | {r.steps} "
                     f"| {r.cache_hits} |")
    return "\n".join(lines) + "\n"
