"""Single-sequence generation: chunked prefill, then one token per step, sampled per position.

The executor decides the device: HostExecutor (NumPy) by default, or one made by make_executor
for 'cuda' (runtime/cuda_executor.py), which the caller keeps across calls so that the weights
are uploaded once (a chat reuses it for every turn). On the CUDA executor decode steps overlap
(runtime/pipeline.py): step i+1 is launched, its input token fed on the device from step i's
sample, before the host reads step i's token; the tokens are the same either way.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..errors import GlimmerError
from ..model.model import Model
from ..reference.sampling import SamplingParams
from .cell_pool import CellPool
from .host_executor import HostExecutor
from .pipeline import decode_steps
from .sequence import Sequence
from .step_planner import MAX_STEP_TOKENS, plan_step


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    reused_tokens: int = 0                  # of the prompt, whose K/V a Session already held
    prompt_seconds: float = 0.0
    generated_tokens: int = 0
    generate_seconds: float = 0.0
    flagged_rows: int = 0                   # steps whose logits were not finite
    stop_reason: str = ""
    extra: dict = field(default_factory=dict)

    def rates(self) -> tuple[float, float]:
        """(prompt tokens computed a second, generated tokens a second)."""
        pf = (self.prompt_tokens - self.reused_tokens) / self.prompt_seconds if self.prompt_seconds else 0.0
        gen = self.generated_tokens / self.generate_seconds if self.generate_seconds else 0.0
        return pf, gen


def check_lengths(model: Model, n_prompt: int, max_new: int) -> None:
    ctx = model.cfg.context
    if n_prompt == 0:
        raise GlimmerError("the prompt is empty (0 tokens)")
    if max_new <= 0:
        raise GlimmerError(f"the number of tokens to generate must be > 0, got {max_new}")
    if n_prompt + max_new > ctx:
        raise GlimmerError(f"prompt of {n_prompt} tokens plus {max_new} to generate exceeds "
                           f"the context of {ctx} tokens")


def make_executor(model: Model, device: str, n_cells: int | None = None, graphs: bool = True, pdl: bool = True,
                  overlap: bool = True, many_sequences: bool = False):
    """The executor to keep for a device: for 'cuda' a CudaExecutor (n_cells None sizes its KV
    pool from the free device memory, capped at one full context plus the scratch cell, or with
    many_sequences, for the engine, at the executor's own cap; overlap: generate()'s default for
    it); for 'cpu' None, so that generate makes a HostExecutor sized to each request."""
    if device == "cuda":
        from .cuda_executor import MAX_CELLS, CudaExecutor
        cap = max(MAX_CELLS, model.cfg.context + 1) if many_sequences else model.cfg.context + 1
        return CudaExecutor(model.decoder, n_cells, max_cells=cap, graphs=graphs, pdl=pdl, overlap=overlap)
    if device != "cpu":
        raise GlimmerError(f"device must be cpu or cuda, got {device!r}")
    return None


class Session:
    """One conversation's K/V kept between calls of generate(session=...) on one executor (a
    chat's turns): a call computes only the part of its prompt after the longest prefix it shares
    with the tokens the session has already run, so a turn costs its new tokens, not the whole
    conversation again. A prefix is reused only where it is token for token the same, so the
    output is what a call without the session gives (the same positions, so the same random
    draws; K/V computed in other steps, so on the NumPy path equal up to summation order).

    executor: one from make_executor, or None for a HostExecutor of the model's whole context
    (NumPy's zeroed arrays take memory only where cells are written)."""

    def __init__(self, model: Model, executor=None):
        self.executor = executor if executor is not None else HostExecutor(model.decoder, model.cfg.context + 1)
        self.pool = CellPool(int(self.executor.kv[0][0].shape[0]))
        self.seq: Sequence | None = None

    def start(self, prompt_ids: list[int], params: SamplingParams) -> tuple[Sequence, int]:
        """The sequence for a call with this prompt, holding the cells of the prefix it shares with
        the last call's computed tokens (at most all but the prompt's last token, which must run to
        sample the first new one), and that prefix's length. The other cells go back to the pool."""
        old, keep = self.seq, 0
        if old is not None:
            done = old.tokens[:old.n_computed]
            limit = min(len(done), len(prompt_ids) - 1)
            while keep < limit and done[keep] == prompt_ids[keep]:
                keep += 1
            self.pool.release(old.cells[keep:])
        self.seq = Sequence(list(prompt_ids), params, cells=list(old.cells[:keep]) if old is not None else [])
        return self.seq, keep

    def forget(self) -> None:
        """Drop the K/V held (after a call that failed part way, whose cells may not have been written)."""
        if self.seq is not None:
            self.seq.free(self.pool)
        self.seq = None


def generate(model: Model, prompt_ids: list[int], max_new: int, params: SamplingParams,
             stop_ids=frozenset(), stats: GenerationStats | None = None, executor=None,
             overlap: bool | None = None, session: Session | None = None) -> Iterator[int]:
    """Yield up to max_new tokens; stops after a token in stop_ids (which is yielded).

    executor: one from make_executor, reused across calls (its KV pool is rewritten cell by cell
    before anything reads it); None makes a HostExecutor for this call. session: a Session whose
    executor runs the call and whose K/V of the prompt's longest shared prefix is reused (then
    `executor` must be None or the session's). overlap: launch each decode step before the
    previous one's token is on the host (runtime/pipeline.py; the same tokens); None takes the
    executor's `overlap` (on for CUDA, off for NumPy)."""
    params.check(model.cfg.vocab)
    check_lengths(model, len(prompt_ids), max_new)
    stats = stats if stats is not None else GenerationStats()
    need = len(prompt_ids) + max_new + 1
    if session is not None:
        if executor is not None and executor is not session.executor:
            raise GlimmerError("generate: executor must be the session's (or None) when a session is given")
        executor = session.executor
    elif executor is None:
        executor = HostExecutor(model.decoder, need)
    n_cells = int(executor.kv[0][0].shape[0])            # both executors: kv[layer] = (k_pool, v_pool)
    if n_cells < need:
        raise GlimmerError(f"prompt of {len(prompt_ids)} tokens plus {max_new} to generate needs {need} KV cells, "
                           f"the executor's pool holds {n_cells}")
    if session is not None:
        seq, stats.reused_tokens = session.start(prompt_ids, params)
        pool = session.pool
    else:
        pool = CellPool(n_cells)
        seq = Sequence(list(prompt_ids), params)

    def advance(n: int) -> tuple[int, int]:
        """Run the next n pending tokens; (token, flag) sampled after them, or (-1, 0) mid-prompt."""
        step = plan_step(pool, [(seq, n)])
        if not len(step.logit_rows):
            executor.run_step(step, [], [])
            return -1, 0
        tokens, flags = executor.run_step(step, [params], [len(seq.tokens)])
        return int(tokens[0]), int(flags[0])

    if overlap is None:
        overlap = bool(getattr(executor, "overlap", False))
    stats.prompt_tokens = len(prompt_ids)
    steps = None
    try:
        t0 = time.perf_counter()
        while seq.n_pending > MAX_STEP_TOKENS:
            advance(MAX_STEP_TOKENS)
        tok, flag = advance(seq.n_pending)               # the last chunk of the prompt samples the first token
        stats.prompt_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        seq.tokens.append(tok)
        steps = decode_steps(executor, pool, [seq], max_new - 1, overlap)   # each appends its token
        for i in range(max_new):
            if i:
                tokens, flags = next(steps)
                tok, flag = int(tokens[0]), int(flags[0])
            stats.flagged_rows += flag
            stats.generated_tokens += 1
            stats.generate_seconds = time.perf_counter() - t0
            yield tok
            if tok in stop_ids:
                stats.stop_reason = "stop token"
                return
        stats.stop_reason = "length"
    except GeneratorExit:
        raise                                            # closed at a yield: the sequence is whole
    except BaseException:
        if steps is not None:
            steps.close()
            steps = None
        if session is not None:                          # a step may have failed after taking its cells
            session.forget()
        raise
    finally:
        if steps is not None:
            steps.close()                                # discards a step launched past a stop token
