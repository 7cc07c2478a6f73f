"""`glimmer bench decode`: single-stream prefill and decode speed of a model on the CUDA path, next to
the device's copy bandwidth measured in the same run.

- prefill: one step of `prompt` random tokens (the eager, cuBLAS-backed wide step), median of runs;
- decode: `gen` greedy steps after that prompt, one token each (graph replays), timed on the host
  around each step (a step returns its token id, so the time includes the launch and the copy);
  tok/s = tokens / summed step time, median over runs;
- bytes per token: every weight matrix read once (the embedding table only where the head is
  tied to it; a lookup reads one row) plus the K and V the step's attention reads; achieved
  bandwidth = bytes / step time, and its fraction of the copy bandwidth (bytes read + written
  per second of a 1 GiB device-to-device copy);
- breakdown (optional): one decode step run eagerly with CUDA events around every op, queued behind
  a spin kernel so that the events time the GPU, not the host (op_breakdown), summed by op
  (matmuls by weight kind), so the largest costs have names; their sum is set beside the graph
  step's time (the difference is launch gaps the graph hides, and the host's share of a step).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field

import numpy as np

from ..model.model import Model
from ..reference.sampling import GREEDY
from ..runtime.cell_pool import CellPool
from ..runtime.sequence import Sequence
from ..runtime.step_planner import plan_step


@dataclass
class DecodeBench:
    model: str
    prompt_tokens: int
    gen_tokens: int
    runs: int
    graphs: bool
    weight_bytes_per_token: int
    kv_bytes_per_token: int
    copy_bandwidth: float                   # bytes/s, read + written
    prefill_s: list[float] = field(default_factory=list)
    decode_s: list[float] = field(default_factory=list)       # whole decode of gen_tokens, per run
    step_us_median: float = 0.0
    breakdown: list[dict] = field(default_factory=list)
    breakdown_total_us: float = 0.0

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / float(np.median(self.prefill_s))

    @property
    def decode_tok_s(self) -> float:
        return self.gen_tokens / float(np.median(self.decode_s))

    @property
    def bytes_per_token(self) -> int:
        return self.weight_bytes_per_token + self.kv_bytes_per_token

    @property
    def achieved_bandwidth(self) -> float:
        return self.bytes_per_token * self.decode_tok_s

    @property
    def fraction_of_copy(self) -> float:
        """Copy-bandwidth floor of a token (bytes / copy bandwidth) over its measured time."""
        return self.achieved_bandwidth / self.copy_bandwidth

    def summary(self) -> dict:
        d = asdict(self)
        d.update(prefill_tok_s=self.prefill_tok_s, decode_tok_s=self.decode_tok_s,
                 bytes_per_token=self.bytes_per_token, achieved_bandwidth=self.achieved_bandwidth,
                 fraction_of_copy=self.fraction_of_copy)
        return d


def decode_weight_bytes(model: Model) -> int:
    """Weight bytes a decode step reads: every matrix once; the embedding table only as the head."""
    from ..runtime.cuda_executor import unique_weight_bytes
    w = model.weights
    tied = any(p is w.embed for p in w.head.parts)
    return unique_weight_bytes(w) - (0 if tied else w.embed.nbytes)


def kv_bytes(model: Model, context: float) -> int:
    """K and V bytes (bf16) attention reads for one token at `context` positions, all layers; sliding
    layers read at most their window."""
    cfg = model.cfg
    per_pos = 2 * cfg.n_kv_heads * cfg.head_dim * 2
    return int(sum(per_pos * (min(context, cfg.window(i)) if cfg.window(i) else context)
                   for i in range(cfg.n_layers)))


def _prompt(model: Model, n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, model.cfg.vocab, n).tolist()


def _one_run(ex, model: Model, prompt: list[int], gen: int) -> tuple[float, float, list[float]]:
    """(prefill seconds, decode seconds, per-step seconds) of one prompt and gen greedy tokens."""
    pool = CellPool(ex.n_cells)
    seq = Sequence(list(prompt), GREEDY)
    t0 = time.perf_counter()
    tok, _ = ex.run_step(plan_step(pool, [(seq, len(prompt))]), [GREEDY], [len(prompt)])
    prefill = time.perf_counter() - t0
    seq.tokens.append(int(tok[0]))
    steps = []
    for _ in range(gen - 1):
        t0 = time.perf_counter()
        tok, _ = ex.run_step(plan_step(pool, [(seq, 1)]), [GREEDY], [len(seq.tokens)])
        steps.append(time.perf_counter() - t0)
        seq.tokens.append(int(tok[0]))
    # the first token came with the prompt: gen - 1 steps, scaled to gen tokens
    return prefill, sum(steps) * gen / max(gen - 1, 1), steps


def bench_decode(model: Model, name: str, prompt_tokens: int = 512, gen_tokens: int = 128, runs: int = 5,
                 graphs: bool = True, breakdown: bool = True, progress=None) -> DecodeBench:
    from ..runtime.cuda_executor import CudaExecutor
    from .timing import copy_bandwidth

    say = progress or (lambda _msg: None)
    need = prompt_tokens + gen_tokens + 2
    ex = CudaExecutor(model.decoder, need, graphs=graphs, max_step_tokens=max(prompt_tokens, 64))
    res = DecodeBench(model=name, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, runs=runs, graphs=graphs,
                      weight_bytes_per_token=decode_weight_bytes(model),
                      kv_bytes_per_token=kv_bytes(model, prompt_tokens + gen_tokens / 2),
                      copy_bandwidth=copy_bandwidth())
    prompt = _prompt(model, prompt_tokens)
    say("warm-up run (compiles kernels, captures graphs)")
    _one_run(ex, model, prompt, min(gen_tokens, 8))
    steps = []
    for r in range(runs):
        pf, dec, st = _one_run(ex, model, prompt, gen_tokens)
        res.prefill_s.append(pf)
        res.decode_s.append(dec)
        steps += st
        say(f"run {r + 1}/{runs}: prefill {prompt_tokens / pf:,.0f} tok/s, decode {gen_tokens / dec:,.1f} tok/s")
    res.step_us_median = float(np.median(steps) * 1e6)
    if breakdown:
        res.breakdown, res.breakdown_total_us = op_breakdown(ex, model, prompt)
    return res


# ---- per-op breakdown of one decode step ----------------------------------------------------

_OPS = ("embed", "rms_norm", "add_rms_norm_", "quant_matmul", "rope", "kv_write_", "prepare_qkv_", "attention", "silu_mul",
        "gelu_mul", "softcap", "sample_rows")


def _weight_kind(name: str) -> str:
    """'blk.3.attn_qkv' -> 'attn_qkv'; 'output.weight' -> 'output'."""
    return re.sub(r"^blk\.\d+\.", "", name).removesuffix(".weight")


@contextlib.contextmanager
def _timed_ops(stream, records: list):
    """Patch the ops the decoder and executor call so each records (label, start, end) events."""
    import cupy

    from .. import ops

    saved = {name: getattr(ops, name) for name in _OPS}

    def wrap(name, fn):
        def timed(*args, **kwargs):
            label = name
            if name == "quant_matmul":
                w = args[1]
                label = f"quant_matmul {_weight_kind(w.name)} ({w.qtype.name})"
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            out = fn(*args, **kwargs)
            end.record(stream)
            records.append((label, start, end))
            return out
        return timed

    try:
        for name, fn in saved.items():
            setattr(ops, name, wrap(name, fn))
        yield
    finally:
        for name, fn in saved.items():
            setattr(ops, name, fn)


def op_breakdown(ex, model: Model, prompt: list[int]) -> tuple[list[dict], float]:
    """One decode step (after the prompt) run eagerly with events around every op: rows of
    {op, calls, us, share} by total time, and the summed microseconds.

    Eager launches from Python are slower than the GPU runs them, so the step is queued behind a
    spin kernel: by the time the GPU reaches the first op every op is queued, and each pair of
    events brackets only its op's kernels. The step's inputs go up before the spin (a copy from
    pageable memory would wait for it); if the GPU still reached the first op before the host had
    queued the last, the spin doubles and the step runs again."""
    import cupy

    from .. import ops
    from ..ops.matmul import graph_safe
    from ..ops.sampling import DeviceSamplingParams
    from .timing import _spin

    pool = CellPool(ex.n_cells)
    seq = Sequence(list(prompt) + [0], GREEDY)
    ex.run_step(plan_step(pool, [(seq, len(prompt))]), [], [])
    step = ex.upload_step(plan_step(pool, [(seq, 1)]))
    params = DeviceSamplingParams.from_params([GREEDY], model.cfg.vocab)
    positions = cupy.asarray(np.array([len(seq.tokens)], np.int32))
    spin_us = 20_000.0
    for _ in range(6):
        records: list = []
        cupy.cuda.Device().synchronize()
        with ex.stream, graph_safe(), _timed_ops(ex.stream, records):
            _spin(spin_us)
            logits = ex.decoder.forward(step, ex.kv)
            ops.sample_rows(logits, params, positions)
            queued_in_time = not records[0][1].done
        cupy.cuda.Device().synchronize()
        if queued_in_time:
            break
        spin_us *= 2
    else:
        raise RuntimeError("op_breakdown: the host could not queue one step within the spin")
    total: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for label, start, end in records:
        total[label] += cupy.cuda.get_elapsed_time(start, end) * 1e3
        calls[label] += 1
    whole = sum(total.values())
    rows = [{"op": k, "calls": calls[k], "us": v, "share": v / whole}
            for k, v in sorted(total.items(), key=lambda kv: -kv[1])]
    return rows, whole


def markdown(results: list[DecodeBench], meta: dict) -> str:
    lines = [f"# Single-stream decode, {meta['gpu']}, {meta['date']}, commit {meta['commit']}", "",
             f"Copy bandwidth measured in the same run: {results[0].copy_bandwidth / 1e12:.2f} TB/s "
             "(read + written). Prefill: one step of the prompt. Decode: greedy, one token per step, "
             "CUDA graphs " + ("on" if results[0].graphs else "off") + ", host time per step.", "",
             "| model | prefill tok/s | decode tok/s | step µs | MB/token (weights + KV) | achieved GB/s | of copy |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.model} | {r.prefill_tok_s:,.0f} | {r.decode_tok_s:,.1f} | {r.step_us_median:.0f} | "
                     f"{r.weight_bytes_per_token / 1e6:.1f} + {r.kv_bytes_per_token / 1e6:.1f} | "
                     f"{r.achieved_bandwidth / 1e9:,.0f} | {r.fraction_of_copy:.1%} |")
    for r in results:
        if not r.breakdown:
            continue
        lines += ["", (f"## One decode step of {r.model}: GPU time per op, CUDA events "
                       f"(sum {r.breakdown_total_us:.0f} µs; graph step {r.step_us_median:.0f} µs on the host)"), "",
                  "| op | calls | µs | share |", "|---|---|---|---|"]
        for row in r.breakdown[:20]:
            lines.append(f"| {row['op']} | {row['calls']} | {row['us']:.1f} | {row['share']:.1%} |")
    return "\n".join(lines) + "\n"
