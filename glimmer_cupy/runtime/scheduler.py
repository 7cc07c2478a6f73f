"""Decode-first scheduler: which tokens of which requests run in the next step.

Policy (each schedule() call plans one step of at most `budget` tokens):
  1. Running sequences that are decoding get one token each, oldest first.
  2. Then prefill chunks, in arrival order: sequences already admitted and partly prefilled,
     then waiting requests admitted from the head of the queue (FIFO, no overtaking, so a long
     prompt is not starved by short ones behind it).
  3. Admission: a waiting request is admitted when the pool's free cells, less the cells this
     step's decodes take and less the prompt cells still owed to admitted prefills, hold its
     whole pending prompt. Otherwise it stays queued and is admitted when cells free up.
  4. Preemption: when the pool cannot give each decode its cell, the newest running sequence
     is preempted: its cells are freed and it goes back to the queue (in arrival order) with
     its prompt and the tokens generated so far, to be recomputed by prefill. Generated tokens
     are kept, and sampling is keyed by (seed, position), so recompute changes no token.
  5. With a prefix cache (runtime/prefix_cache.py), a request admitted with no cells first takes
     the cached blocks its tokens begin with, so it is admitted for the cells of the rest; every
     running sequence's blocks are kept as they are computed (Engine.step). Cells the cache alone
     holds are dropped, least recently used first, before any admission waits or any sequence is
     preempted for want of them.
  6. Rejection, at add(): an empty prompt, max_new <= 0, bad sampling parameters, prompt +
     max_new over the model context, or more cells than the whole pool has. Every request that
     passes fits the pool alone, so the oldest running sequence always progresses.
Every added request ends in results: finished (tokens, stop reason) or rejected (reason).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import count

from ..errors import GlimmerError
from ..reference.sampling import GREEDY, SamplingParams
from .cell_pool import CellPool
from .prefix_cache import PrefixCache
from .sequence import Sequence

_request_ids = count()


@dataclass
class Request:
    prompt: list[int]
    max_new: int
    params: SamplingParams = GREEDY
    stop_ids: frozenset = frozenset()
    id: object = field(default_factory=lambda: next(_request_ids))


@dataclass
class Result:
    id: object
    tokens: list[int]
    stop_reason: str            # "stop token", "length" or "rejected"
    reason: str = ""            # why it was rejected
    preemptions: int = 0
    flagged_rows: int = 0       # sampled rows whose logits were not finite


@dataclass
class Entry:
    """A request the scheduler holds: its sequence and where it stands."""
    request: Request
    seq: Sequence
    arrival: int
    state: str = "waiting"      # waiting -> prefill -> decode; preemption -> waiting
    preemptions: int = 0
    flagged_rows: int = 0


class Scheduler:
    def __init__(self, pool: CellPool, context: int, vocab: int, budget: int = 64, cache: PrefixCache | None = None):
        if budget < 1:
            raise GlimmerError(f"the step budget must be >= 1 token, got {budget}")
        self.pool, self.context, self.vocab, self.budget = pool, context, vocab, budget
        self.cache = cache
        self.waiting: deque[Entry] = deque()    # arrival order
        self.running: list[Entry] = []          # arrival order: the newest is last
        self.results: dict[object, Result] = {}
        self._by_seq: dict[int, Entry] = {}
        self._arrivals = count()

    def add(self, request: Request) -> None:
        if request.id in self.results or any(e.request.id == request.id for e in self._entries()):
            raise GlimmerError(f"request id {request.id!r} is already in use")
        reason = self._reject_reason(request)
        if reason:
            self.results[request.id] = Result(request.id, [], "rejected", reason)
            return
        e = Entry(request, Sequence(list(request.prompt), request.params), next(self._arrivals))
        self._by_seq[e.seq.id] = e
        self.waiting.append(e)

    def _reject_reason(self, r: Request) -> str:
        n, cells = len(r.prompt), self.pool.n_cells - 1        # one cell is scratch
        if n == 0:
            return "the prompt is empty (0 tokens)"
        if r.max_new <= 0:
            return f"the number of tokens to generate must be > 0, got {r.max_new}"
        if n + r.max_new > self.context:
            return (f"prompt of {n} tokens plus {r.max_new} to generate exceeds "
                    f"the context of {self.context} tokens")
        if n + r.max_new - 1 > cells:                          # the last token is never run
            return (f"prompt of {n} tokens plus {r.max_new} to generate needs "
                    f"{n + r.max_new - 1} KV cells, the pool has {cells}")
        try:
            r.params.check(self.vocab)
        except GlimmerError as err:
            return str(err)
        return ""

    def _entries(self):
        return list(self.waiting) + self.running

    def entry(self, seq: Sequence) -> Entry:
        return self._by_seq[seq.id]

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def schedule(self) -> list[tuple[Sequence, int]]:
        """The chunks (sequence, n tokens) of the next step; [] when there is nothing to run."""
        decodes = [e for e in self.running if e.state == "decode"]
        while self.pool.n_free < len(decodes):                 # grow or preempt, never crash
            if not self._evict(len(decodes)):
                self.preempt(self.running[-1])
            decodes = [e for e in self.running if e.state == "decode"]
        budget = self.budget - len(decodes)
        free = self.pool.n_free - len(decodes)
        chunks = [(e.seq, 1) for e in decodes]
        # cells owed to admitted prefills: admission must leave them free
        owed = sum(e.seq.n_pending for e in self.running if e.state == "prefill")
        for e in [e for e in self.running if e.state == "prefill"]:
            n = min(e.seq.n_pending, budget, free)
            if n:
                chunks.append((e.seq, n))
                budget, free = budget - n, free - n
        while self.waiting and budget > 0 and len(self.running) < self.budget:
            e = self.waiting[0]
            chain = self.cache.match(e.seq.tokens) if self.cache is not None and not e.seq.n_computed else []
            need = e.seq.n_pending - len(chain) * (self.cache.block if chain else 0)
            free += self._evict(need + len(decodes) + owed, chain)
            if need > self.pool.n_free - len(decodes) - owed:
                break                                          # stays queued until cells free up
            if chain:
                self.cache.attach(e.seq, chain)
            self.waiting.popleft()
            e.state = "prefill"
            self.running.append(e)
            owed += e.seq.n_pending
            n = min(e.seq.n_pending, budget, free)
            if n:
                chunks.append((e.seq, n))
                budget, free = budget - n, free - n
        if not chunks and self.running:
            # admitted prefills all stalled on cells that decodes took: make room, try again
            if not self._evict(self.pool.n_cells):
                self.preempt(self.running[-1])
            return self.schedule()
        return chunks

    def _evict(self, free_needed: int, keep=()) -> int:
        """With a cache, drop blocks only it holds until free_needed cells are free (as far as it
        can; keep: blocks not to drop); the cells freed."""
        if self.cache is None:
            return 0
        before = self.pool.n_free
        self.cache.evict(free_needed, keep)
        return self.pool.n_free - before

    def preempt(self, e: Entry) -> None:
        """Free e's cells and requeue it, in arrival order, to be recomputed by prefill."""
        self.running.remove(e)
        if self.cache is not None:
            self.cache.forget(e.seq)
        e.seq.free(self.pool)
        e.state = "waiting"
        e.preemptions += 1
        at = sum(1 for w in self.waiting if w.arrival < e.arrival)
        self.waiting.insert(at, e)

    def started_decoding(self, e: Entry) -> None:
        e.state = "decode"

    def finish(self, e: Entry, stop_reason: str) -> Result:
        self.running.remove(e)
        if self.cache is not None:
            self.cache.insert(e.seq)
            self.cache.forget(e.seq)
        e.seq.free(self.pool)
        del self._by_seq[e.seq.id]
        r = Result(e.request.id, list(e.seq.generated), stop_reason, "", e.preemptions, e.flagged_rows)
        self.results[e.request.id] = r
        return r
