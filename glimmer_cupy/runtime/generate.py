"""Single-sequence generation: chunked prefill, then one token per step, sampled per position."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

from ..errors import GlimmerError
from ..model.model import Model
from ..reference.sampling import SamplingParams
from .cell_pool import CellPool
from .host_executor import HostExecutor
from .sequence import Sequence
from .step_planner import plan_step

PREFILL_CHUNK = 512          # tokens per prefill step on the NumPy path (bounds its scratch memory)


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    generated_tokens: int = 0
    generate_seconds: float = 0.0
    flagged_rows: int = 0                   # steps whose logits were not finite
    stop_reason: str = ""
    extra: dict = field(default_factory=dict)

    def rates(self) -> tuple[float, float]:
        pf = self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0
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


def generate(model: Model, prompt_ids: list[int], max_new: int, params: SamplingParams,
             stop_ids=frozenset(), stats: GenerationStats | None = None) -> Iterator[int]:
    """Yield up to max_new tokens; stops after a token in stop_ids (which is yielded)."""
    params.check(model.cfg.vocab)
    check_lengths(model, len(prompt_ids), max_new)
    stats = stats if stats is not None else GenerationStats()
    pool = CellPool(len(prompt_ids) + max_new + 1)
    ex = HostExecutor(model.decoder, pool.n_cells)
    seq = Sequence(list(prompt_ids), params)
    stats.prompt_tokens = len(prompt_ids)
    t0 = time.perf_counter()
    while True:
        step = plan_step(pool, [(seq, min(seq.n_pending, PREFILL_CHUNK))])
        logits = ex.logits(step)
        if len(step.logit_rows):
            break
    stats.prompt_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(max_new):
        if i:
            logits = ex.logits(plan_step(pool, [(seq, 1)]))
        tokens, flags = ex.sample(logits, [params], [len(seq.tokens)])
        tok = int(tokens[0])
        stats.flagged_rows += int(flags[0])
        seq.tokens.append(tok)
        stats.generated_tokens += 1
        stats.generate_seconds = time.perf_counter() - t0
        yield tok
        if tok in stop_ids:
            stats.stop_reason = "stop token"
            return
    stats.stop_reason = "length"
