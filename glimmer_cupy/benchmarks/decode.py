"""`glimmer bench decode`: prefill and decode speed of a model on the CUDA path, one sequence or a
batch of them decoding together, next to the device's copy bandwidth measured in the same run.

- prefill: one step of `prompt` random tokens (the eager, cuBLAS-backed wide step), median of runs;
- decode: `gen` greedy steps after that prompt, one token each (graph replays), timed on the host
  from one step's tokens to the next's (so the time includes planning, the launch and the copy
  wherever the device waits for them); tok/s = tokens / summed step time, median over runs.
  Steps overlap (runtime/pipeline.py: step i+1 is launched, its tokens fed on the device, before
  the host reads step i's) unless overlap is off, which times each step from launch to token. With a batch of B sequences (the same
  prompt each, prefilled one after another), a step decodes one token of every sequence and tok/s
  counts all of them;
- bytes per step: every weight matrix read once (the embedding table only where the head is
  tied to it; a lookup reads one row) plus the K and V the step's attention reads for each
  sequence; achieved bandwidth = bytes / step time, and its fraction of the copy bandwidth
  (bytes read + written per second of a 1 GiB device-to-device copy);
- profile (optional): one more decode step between cudaProfilerStart/Stop, for a per-kernel time
  breakdown under ncu (bench/decode_breakdown.sh runs it and sums the kernels by name).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ..model.model import Model
from ..reference.sampling import GREEDY
from ..runtime.cell_pool import CellPool
from ..runtime.pipeline import decode_steps
from ..runtime.sequence import Sequence
from ..runtime.step_planner import plan_step


@dataclass
class DecodeBench:
    model: str
    prompt_tokens: int
    gen_tokens: int
    runs: int
    graphs: bool
    pdl: bool
    weight_bytes_per_token: int
    kv_bytes_per_token: int
    copy_bandwidth: float                   # bytes/s, read + written
    prefill_s: list[float] = field(default_factory=list)
    decode_s: list[float] = field(default_factory=list)       # whole decode of gen_tokens, per run
    step_us_median: float = 0.0
    gpu_step_us: float = 0.0                # the decode step's graph replayed back to back (0: no graphs)
    prefill_chunk: int = 0                  # 0: the prompt in one step
    batch: int = 1                          # sequences decoding together, one token each per step
    overlap: bool = True                    # step i+1 launched before step i's tokens are read

    @property
    def prefill_tok_s(self) -> float:
        return self.batch * self.prompt_tokens / float(np.median(self.prefill_s))

    @property
    def decode_tok_s(self) -> float:
        """Tokens of all the batch's sequences per second."""
        return self.batch * self.gen_tokens / float(np.median(self.decode_s))

    @property
    def bytes_per_step(self) -> int:
        return self.weight_bytes_per_token + self.batch * self.kv_bytes_per_token

    @property
    def achieved_bandwidth(self) -> float:
        return self.bytes_per_step * self.decode_tok_s / self.batch

    @property
    def fraction_of_copy(self) -> float:
        """Copy-bandwidth floor of a token (bytes / copy bandwidth) over its measured time."""
        return self.achieved_bandwidth / self.copy_bandwidth

    def summary(self) -> dict:
        d = asdict(self)
        d.update(prefill_tok_s=self.prefill_tok_s, decode_tok_s=self.decode_tok_s,
                 bytes_per_step=self.bytes_per_step, achieved_bandwidth=self.achieved_bandwidth,
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


def _one_run(ex, prompt: list[int], gen: int, chunk: int = 0, batch: int = 1, overlap: bool = True):
    """(prefill seconds, decode seconds, per-step seconds, the sequences) of `batch` sequences of one
    prompt and gen greedy tokens each: each prompt in one step (or in steps of `chunk` tokens), one
    sequence after another; then steps of one token of every sequence (overlapped: decode_steps)."""
    pool = CellPool(ex.n_cells)
    seqs = [Sequence(list(prompt), GREEDY) for _ in range(batch)]
    t0 = time.perf_counter()
    for seq in seqs:
        while chunk and seq.n_pending > chunk:
            ex.run_step(plan_step(pool, [(seq, chunk)]), [], [])
        tok, _ = ex.run_step(plan_step(pool, [(seq, seq.n_pending)]), [GREEDY], [len(prompt)])
        seq.tokens.append(int(tok[0]))
    prefill = time.perf_counter() - t0
    steps = []
    t0 = time.perf_counter()
    for _ in decode_steps(ex, pool, seqs, gen - 1, overlap):     # appends each step's tokens
        t1 = time.perf_counter()
        steps.append(t1 - t0)
        t0 = t1
    # the first token came with the prompt: gen - 1 steps, scaled to gen tokens
    return prefill, sum(steps) * gen / max(gen - 1, 1), steps, seqs


def bench_decode(model: Model, name: str, prompt_tokens: int = 512, gen_tokens: int = 128, runs: int = 5,
                 graphs: bool = True, profile: bool = False, progress=None, pdl: bool = True,
                 prefill_chunk: int = 0, batch: int = 1, overlap: bool = True) -> DecodeBench:
    from ..runtime.cuda_executor import CudaExecutor
    from .timing import copy_bandwidth

    say = progress or (lambda _msg: None)
    need = batch * (prompt_tokens + gen_tokens + 2)
    ex = CudaExecutor(model.decoder, need, graphs=graphs, max_step_tokens=max(prompt_tokens, 64), pdl=pdl)
    res = DecodeBench(model=name, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, runs=runs, graphs=graphs,
                      pdl=ex.pdl, prefill_chunk=prefill_chunk, batch=batch, overlap=overlap,
                      weight_bytes_per_token=decode_weight_bytes(model),
                      kv_bytes_per_token=kv_bytes(model, prompt_tokens + gen_tokens / 2),
                      copy_bandwidth=copy_bandwidth())
    prompt = _prompt(model, prompt_tokens)
    say("warm-up run (compiles kernels, captures graphs)")
    _one_run(ex, prompt, min(gen_tokens, 8), prefill_chunk, batch, overlap)
    if prefill_chunk:
        _one_run(ex, prompt, 2, prefill_chunk, batch, overlap)   # the chunks' graphs are captured on their second run
    steps = []
    for r in range(runs):
        pf, dec, st, _ = _one_run(ex, prompt, gen_tokens, prefill_chunk, batch, overlap)
        res.prefill_s.append(pf)
        res.decode_s.append(dec)
        steps += st
        say(f"run {r + 1}/{runs}: prefill {batch * prompt_tokens / pf:,.0f} tok/s, "
            f"decode {batch * gen_tokens / dec:,.1f} tok/s")
    res.step_us_median = float(np.median(steps) * 1e6)
    if graphs:
        res.gpu_step_us = ex.replay_time_us()
    if profile:
        profile_step(ex, prompt)
    return res


def profile_step(ex, prompt: list[int]) -> None:
    """One graph-replayed decode step between cudaProfilerStart and cudaProfilerStop, so that
    `ncu --profile-from-start off` (bench/decode_breakdown.sh) times exactly its kernels."""
    import cupy

    pool = CellPool(ex.n_cells)
    seq = Sequence(list(prompt), GREEDY)
    ex.run_step(plan_step(pool, [(seq, len(prompt))]), [GREEDY], [len(prompt)])
    seq.tokens.append(0)
    for _ in range(3):                                   # capture the decode shape's graph first
        ex.run_step(plan_step(pool, [(seq, 1)]), [GREEDY], [len(seq.tokens)])
        seq.tokens.append(0)
    cupy.cuda.runtime.profilerStart()
    ex.run_step(plan_step(pool, [(seq, 1)]), [GREEDY], [len(seq.tokens)])
    cupy.cuda.runtime.profilerStop()


def markdown(results: list[DecodeBench], meta: dict) -> str:
    lines = [f"# Decode, {meta['gpu']}, {meta['date']}, commit {meta['commit']}", "",
             f"Copy bandwidth measured in the same run: {results[0].copy_bandwidth / 1e12:.2f} TB/s "
             "(read + written). Prefill: " + (f"steps of {results[0].prefill_chunk} tokens (CUDA graphs)"
             if results[0].prefill_chunk else "one step of the prompt") + ". Decode: greedy, one token per step, "
             "CUDA graphs " + ("on" if results[0].graphs else "off") + ", programmatic dependent launch "
             + ("on" if results[0].pdl else "off") + ", steps " + ("overlapped (each launched before the previous "
             "one's token is read)" if results[0].overlap else "not overlapped") + ", host time per step; GPU µs: "
             "the step's graph replayed back to "
             "back, the part of a step the device spends. Sequences: decoding together, one "
             "token each per step; tok/s counts them all.", "",
             "| model | sequences | prefill tok/s | decode tok/s | step µs | GPU µs | MB/step (weights + KV) | achieved GB/s "
             "| of copy |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.model} | {r.batch} | {r.prefill_tok_s:,.0f} | {r.decode_tok_s:,.1f} | {r.step_us_median:.0f} | "
                     f"{r.gpu_step_us:.0f} | {r.weight_bytes_per_token / 1e6:.1f} + {r.batch * r.kv_bytes_per_token / 1e6:.1f} | "
                     f"{r.achieved_bandwidth / 1e9:,.0f} | {r.fraction_of_copy:.1%} |")
    return "\n".join(lines) + "\n"
