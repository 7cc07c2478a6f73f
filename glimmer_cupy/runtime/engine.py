"""The serving loop: schedule a step, plan it, run it (the executor pads it to a static width, or runs
it eagerly when wider), commit.

The executor (HostExecutor, or runtime/cuda_executor.py's, which replays one captured graph per
static step shape) runs each step and samples its logit rows: run_step(step, params, positions).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..model.decoder import Decoder
from .cell_pool import CellPool
from .host_executor import HostExecutor
from .prefix_cache import PrefixCache
from .scheduler import Request, Result, Scheduler
from .step_planner import MAX_STEP_TOKENS, plan_step, run_width, slice_chunks

OnToken = Callable[[object, int], None]        # (request id, token), called once per new token

HOST_POOL_CAP = 16384      # the NumPy path's pool for many requests: all at once up to this many cells


def host_pool_cells(needs: Iterable[int]) -> int:
    """KV cells for an engine on the NumPy path serving requests of `needs` cells each (prompt +
    tokens to generate): every request at once up to HOST_POOL_CAP, never fewer than the largest,
    and the scratch cell."""
    needs = list(needs)
    return max(max(needs), min(sum(needs), HOST_POOL_CAP)) + 1


class Engine:
    def __init__(self, decoder: Decoder, n_cells: int, budget: int = MAX_STEP_TOKENS, executor=None,
                 max_step: int = MAX_STEP_TOKENS, prefix_cache: bool = False):
        """prefix_cache: keep sequences' computed blocks, as each step completes them, for later
        requests that begin with the same tokens (runtime/prefix_cache.py; the tokens are the same
        either way)."""
        self.decoder = decoder
        self.pool = CellPool(n_cells)
        self.executor = executor or HostExecutor(decoder, n_cells)
        self.cache = PrefixCache(self.pool) if prefix_cache else None
        self.scheduler = Scheduler(self.pool, decoder.cfg.context, decoder.cfg.vocab, budget, self.cache)
        self.max_step = max_step               # wider steps are sliced (the executors' scratch covers it)
        self.widths_run: list[int] = []        # width of every step run (tests, stats): a static width
                                               # the executor pads to (a CUDA graph each), or eager

    def add(self, request: Request) -> None:
        self.scheduler.add(request)

    def step(self, on_token: OnToken | None = None) -> list[Result]:
        """Run one scheduled step; the results of requests it finished. [] when idle."""
        sch = self.scheduler
        chunks = sch.schedule()
        if not chunks:
            return []
        entries, tokens, flags = [], [], []
        # a step wider than max_step runs as several; a sequence's chunk cut in two runs its
        # first part first, so the K/V it needs is written before it is read
        for part in slice_chunks(chunks, self.max_step):
            step = plan_step(self.pool, part)
            self.widths_run.append(run_width(step.n_tokens))
            # plan_step asks for logits at each chunk that reaches the end of its tokens, in order
            done_here = [sch.entry(seq) for seq, _ in part if seq.n_pending == 0]
            t, f = self.executor.run_step(step, [e.request.params for e in done_here],
                                          [len(e.seq.tokens) for e in done_here])   # the new token's position
            entries += done_here
            tokens += t.tolist()
            flags += f.tolist()
        if self.cache is not None:                               # the blocks this step completed
            for seq, _ in chunks:
                self.cache.insert(seq)
        if not entries:
            return []                                            # prefill chunks only
        done = []
        for e, tok, flag in zip(entries, tokens, flags):
            e.seq.tokens.append(tok)
            e.flagged_rows += flag
            if on_token:
                on_token(e.request.id, tok)
            if tok in e.request.stop_ids:
                done.append(sch.finish(e, "stop token"))
            elif len(e.seq.generated) >= e.request.max_new:
                done.append(sch.finish(e, "length"))
            else:
                sch.started_decoding(e)
        return done

    def run(self, on_token: OnToken | None = None) -> None:
        """Step until every added request is finished or rejected."""
        while not self.scheduler.idle:
            self.step(on_token)

    def generate(self, requests: Iterable[Request], on_token: OnToken | None = None) -> list[Result]:
        """Results in the order of requests (finished or rejected, never lost)."""
        requests = list(requests)
        for r in requests:
            self.add(r)
        self.run(on_token)
        return [self.scheduler.results[r.id] for r in requests]
