"""Runs steps on a CUDA device: the decoder graph over CuPy arrays, on one stream, with CUDA graphs.

`run_step(step, params, positions)` -> host (tokens, flags) of the step's logit rows; the only
device-to-host copy is those ids (the logits stay on the device: `last_logits`, until the next
step). `launch(step, params, positions, feed)` enqueues a static step and returns at once, with a
handle whose result() waits for its ids; feed takes a row's input token from the previous
launch's samples on the device (runtime/pipeline.py), so a decode loop launches step i+1 before
it reads step i's token. `logits(step)` and `sample(...)` remain for tests and for steps no graph
serves. What differs from the NumPy path lives here, not in the graph:
- every weight is uploaded once, at construction: device QuantTensors (GGUF blocks as they are,
  Q6_K matrices with their pairs of super-blocks reordered in place for aligned loads,
  weights/q6k_pairs.py; a tied embedding/head once), norm vectors and biases as CuPy float32;
- the K/V pools are bfloat16 bits (uint16), (n_cells, kv_heads, head_dim) per layer, written by
  kv_write_ with round to nearest even;
- a step's index arrays are checked on the host (the kernels read them unchecked).

Static steps. A step of at most 64 tokens without a visibility mask pads up to a static width T
(1, 2, 4, ..., 64), its logit rows up to a static K and its cell tables to a static width L
(runtime/static_step.py), and runs from buffers kept per (T, K, L): the first run of a key runs
eagerly (compiling kernels and filling the graph memory pool), the next captures a CUDA graph,
and every later one replays it. With graphs off the same buffers and kernels run eagerly, so the
two give the same tokens bit for bit. Static steps run the matmul buckets a graph can capture
(ops.matmul.graph_safe: the mma kernel where eager wide steps use cuBLAS). Their intermediate
arrays come from a memory pool of their own, which keeps every block a graph was captured with
out of other hands; steps run one at a time on one stream, so graphs may share it.
Wider steps, and steps with a mask, run eagerly, padded to nothing.

Launched ahead. A static step's host staging and pinned ids are read and written by the device
when the step executes, after launch() has returned, so there are two sets of them (slots,
runtime/pipeline.py's Slots): a launch takes the slot its predecessor did not when that one is
still in flight or when it feeds on its samples, and waits for the slot's previous launch first.
Every launch samples into its slot's device buffer of ids, which the next launch's feed reads
(ops.feed_tokens_, captured in the graph of a fed step: a graph per slot, and fed or not, so
steps that feed nothing run the same graph as before). A launch's result is one event and a read
of its slot's pinned ids; eager steps (wider, masked) run synchronously.

Errors: a CUDA failure while a step runs becomes CudaStepError naming the step, the layer and
the op (read from the traceback). CUDA reports a faulting kernel asynchronously, at a later call
(for a launched step: when its tokens are waited for, which names the step);
run with CUDA_LAUNCH_BLOCKING=1 (and graphs off) to have it reported by the op that launched it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import numpy as np

from ..errors import GlimmerError, UnsupportedError
from ..kernels.launch import KernelLaunchError, overlapped
from ..model.config import ModelConfig
from ..model.decoder import Decoder
from ..model.fused_stack import DecodeStack
from ..model.linear import Linear
from ..model.step import StepBatch
from ..model.weights import LayerWeights, ModelWeights
from ..ops import feed_tokens_, sample_rows
from ..ops._check import OpArgumentError
from ..ops.attention import HEAD_DIMS, head_chunk, n_splits, workspace_size
from ..ops.embed import TRAITS as EMBED_TRAITS
from ..ops.matmul import TRAITS as MATMUL_TRAITS
from ..ops.matmul import graph_safe
from ..ops.sampling import host_positions
from ..weights import q6k_pairs
from .pipeline import Ready, Slots, check_feed
from .static_step import StaticStep, table_width
from .step_planner import MAX_STEP_TOKENS, STEP_WIDTHS, step_width

MIB = 1 << 20
HEADROOM = 512 * MIB          # CUDA context growth, cuBLAS workspace, kernel modules, pool fragmentation
MAX_STATIC = STEP_WIDTHS[-1]  # widest static step (graphs)
MAX_LOGIT_ROWS = MAX_STATIC   # logit rows per step the scratch estimate covers
MAX_CELLS = 1 << 16           # default cap on a pool sized from free memory
# Q6_K matrices uploaded in pair order (weights/q6k_pairs.py), which their matmul kernels read with
# aligned loads; token tables keep GGUF order (bench/results/NOTES.md, fifty-third session)
Q6K_PAIRS = True


class CudaStepError(RuntimeError):
    """A CUDA failure while running a step: which step, layer and op; the CUDA error is chained."""


# ---- host side: what the CUDA path supports, and how much memory it needs -------------------

def _linears(w: ModelWeights) -> list[Linear]:
    return [w.head] + [m for l in w.layers for m in (l.qkv, l.wo, l.gate_up, l.down)]


def check_cuda_support(cfg: ModelConfig, w: ModelWeights) -> None:
    """Raise UnsupportedError (one line) when a kernel the model needs does not exist."""
    if cfg.head_dim not in HEAD_DIMS:
        raise UnsupportedError(f"the CUDA path has attention kernels for head_dim {'/'.join(map(str, HEAD_DIMS))}, "
                               f"the model has head_dim {cfg.head_dim}; use --device cpu")
    if (cfg.n_kv_heads * cfg.head_dim) % 8:
        raise UnsupportedError(f"the CUDA KV write needs kv_heads * head_dim a multiple of 8, "
                               f"the model has {cfg.n_kv_heads} * {cfg.head_dim}; use --device cpu")
    if w.embed.qtype not in EMBED_TRAITS:
        raise UnsupportedError(f"no CUDA embedding kernel for {w.embed.qtype.name} ({w.embed.name}); use --device cpu")
    for lin in _linears(w):
        for p in lin.parts:
            if p.qtype not in MATMUL_TRAITS or p.shape[1] % 32:
                raise UnsupportedError(f"no CUDA matmul for {p.name}: {p.qtype.name} with K = {p.shape[1]} "
                                       f"(K must be a multiple of 32); use --device cpu")


def unique_weight_bytes(w: ModelWeights) -> int:
    """Bytes the device copy of the weights takes (a tied embedding and head counted once)."""
    seen = {}
    for t in [w.embed] + [p for lin in _linears(w) for p in lin.parts]:
        seen[id(t)] = t.nbytes
    vecs = [w.out_norm] + [v for l in w.layers for v in (l.attn_norm, l.q_norm, l.k_norm, l.post_attn_norm,
                                                         l.ffn_norm, l.post_ffn_norm) if v is not None]
    biases = [lin.bias for lin in _linears(w) if lin.bias is not None]
    return sum(seen.values()) + 4 * sum(int(v.size) for v in vecs + biases)


def cell_bytes(cfg: ModelConfig) -> int:
    """Device bytes of one KV cell over all layers: K and V, bf16."""
    return cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * 2


def scratch_bytes(cfg: ModelConfig, w: ModelWeights, max_tokens: int = MAX_STEP_TOKENS) -> int:
    """A generous bound on what one eager step allocates beside weights and pools: the largest
    matrix decoded to a bf16 scratch (the dequant_cublas bucket, M > 16), the activations of a
    step of max_tokens, attention's split partials, logits, plus HEADROOM."""
    dequant = max(p.shape[0] * p.shape[1] * 2 for lin in _linears(w) for p in lin.parts)
    t = max_tokens
    qkv = cfg.q_dim + 2 * cfg.kv_dim
    # x, h, o, d (hidden); qkv out and its split copies; gate_up, act; q, attention out (q_dim)
    acts = 4 * t * (4 * cfg.hidden + 2 * qkv + 3 * cfg.ffn + 2 * cfg.q_dim) + 2 * t * max(cfg.hidden, cfg.ffn, cfg.q_dim)
    heads = head_chunk(cfg.n_heads // max(cfg.n_kv_heads, 1))
    chunks = -(-(cfg.n_heads // max(cfg.n_kv_heads, 1)) // heads)
    splits = n_splits(t * cfg.n_kv_heads * chunks, cfg.context)
    attn = 4 * workspace_size(t, cfg.n_heads, cfg.head_dim, splits)
    logits = 2 * 4 * min(t, MAX_LOGIT_ROWS) * cfg.vocab
    return int(1.25 * (dequant + acts + attn + logits)) + HEADROOM


def _mb(n: int) -> str:
    return f"{n / MIB:.0f} MiB"


def size_pool(free: int, per_cell: int, scratch: int, n_cells: int | None, max_cells: int = MAX_CELLS,
              min_cells: int = 2) -> int:
    """Cells for the KV pool given `free` device bytes after the weights: n_cells if it fits, else
    as many as fit up to max_cells (at least min_cells). GlimmerError naming both numbers if not."""
    room = free - scratch
    if n_cells is not None:
        need = n_cells * per_cell
        if need > room:
            raise GlimmerError(f"a KV pool of {n_cells} cells needs {_mb(need)} plus {_mb(scratch)} of step scratch; "
                               f"{_mb(free)} of device memory is free after the weights")
        return n_cells
    n = min(max_cells, room // per_cell) if room > 0 else 0
    if n < min_cells:
        raise GlimmerError(f"the model does not fit on the device: after its weights {_mb(free)} is free, it needs "
                           f"{_mb(scratch + min_cells * per_cell)} ({_mb(scratch)} of step scratch and "
                           f"{min_cells} KV cells of {per_cell} bytes)")
    return int(n)


def check_step(step: StepBatch, n_cells: int, vocab: int) -> None:
    """The index contracts the kernels rely on and do not check (they would read or write out of
    bounds): raise GlimmerError naming the array, the bound and the value."""
    t = step.n_tokens
    s, width = step.cell_table.shape

    def within(name, a, lo, hi):
        a = np.asarray(a)
        if not a.size:
            return
        # a decode step's arrays hold a few values: Python's min/max on a list beats numpy's calls
        v = a.ravel().tolist() if a.size <= 256 else None
        amin, amax = (min(v), max(v)) if v is not None else (int(a.min()), int(a.max()))
        if amin < lo or amax >= hi:
            raise GlimmerError(f"step: {name} must be in [{lo}, {hi}), got {amin}..{amax}")

    for name in ("positions", "cells", "tok_seq"):
        if np.asarray(getattr(step, name)).shape != (t,):
            raise GlimmerError(f"step: {name} must have shape ({t},), got {np.asarray(getattr(step, name)).shape}")
    within("tokens", step.tokens, 0, vocab)
    within("cells", step.cells, 0, n_cells)
    within("cell_table", step.cell_table, 0, n_cells)
    within("positions", step.positions, 0, 2 ** 31 - 1)
    within("tok_seq", step.tok_seq, 0, s)
    within("seq_lens", step.seq_lens, 0, width + 1)
    within("logit_rows", step.logit_rows, 0, t)
    if np.asarray(step.seq_lens).shape != (s,):
        raise GlimmerError(f"step: seq_lens must have shape ({s},), got {np.asarray(step.seq_lens).shape}")
    if step.visible is not None and np.asarray(step.visible).shape != (t, width):
        raise GlimmerError(f"step: visible must have shape ({t}, {width}), got {np.asarray(step.visible).shape}")


_INDEX_FIELDS = ("tokens", "positions", "cells", "tok_seq", "cell_table", "seq_lens", "logit_rows")


def pack_step(step: StepBatch) -> tuple[np.ndarray, list[tuple[str, int, int, tuple]]]:
    """The step's index arrays as one int32 host buffer, and (field, start, stop, shape) of each."""
    parts, layout, at = [], [], 0
    for name in _INDEX_FIELDS:
        a = np.asarray(getattr(step, name)).astype(np.int32, copy=False)
        parts.append(a.ravel())
        layout.append((name, at, at + a.size, a.shape))
        at += a.size
    return np.concatenate(parts), layout


def where_failed(tb) -> str:
    """'layer 3, quant_matmul (blk.3.attn_qkv)' from a traceback through the decoder graph: the
    layer the decoder was in, the first glimmer_cupy.ops function entered (the public op), and
    the weight when the op ran inside a Linear."""
    layer = op = weight = None
    line = None
    while tb is not None:
        f = tb.tb_frame
        path = Path(f.f_code.co_filename)
        if path.name == "decoder.py" and path.parent.name == "model":
            layer, line = f.f_locals.get("i"), tb.tb_lineno
        elif path.name == "linear.py" and path.parent.name == "model" and weight is None:
            lin = f.f_locals.get("self")
            parts = getattr(lin, "parts", None)
            weight = parts[0].name if parts else None
        elif path.parent.name == "ops" and path.parent.parent.name == "glimmer_cupy" and op is None:
            op = f.f_code.co_name
        tb = tb.tb_next
    bits = []
    if layer is not None:
        bits.append(f"layer {layer}")
    bits.append(op or (f"decoder.py line {line}" if line else "outside the decoder graph"))
    if weight:
        bits[-1] += f" ({weight})"
    return ", ".join(bits)


# ---- device side ---------------------------------------------------------------------------

def _cuda_errors() -> tuple[type, ...]:
    import cupy
    kinds = [cupy.cuda.runtime.CUDARuntimeError, cupy.cuda.driver.CUDADriverError,
             cupy.cuda.memory.OutOfMemoryError, OpArgumentError, KernelLaunchError]
    for mod, name in (("cupy_backends.cuda.libs.cublas", "CUBLASError"), ("cupy.cuda.compiler", "CompileException")):
        try:
            kinds.append(getattr(__import__(mod, fromlist=[name]), name))
        except (ImportError, AttributeError):
            pass
    return tuple(kinds)


def upload_weights(w: ModelWeights) -> ModelWeights:
    """The weights on the device: QuantTensors uploaded as they are (each once, so a tied
    embedding and head share one copy), Q6_K matrices in pair order where Q6K_PAIRS and they fit it
    (q6k_pairs.repack; not the token table), norm vectors and biases as CuPy float32."""
    import cupy

    done: dict[int, object] = {}
    table = id(w.embed)                          # a tied head shares it: both keep GGUF order

    def qt(t):
        if id(t) not in done:
            dev = t.to_device()
            done[id(t)] = q6k_pairs.repack(dev) if Q6K_PAIRS and id(t) != table else dev
        return done[id(t)]

    def dev(v):
        if v is None:
            return None
        if isinstance(v, Linear):
            return v.to_device(qt)
        return cupy.asarray(np.ascontiguousarray(v, np.float32))

    layers = [LayerWeights(**{f.name: dev(getattr(l, f.name)) for f in dataclasses.fields(LayerWeights)})
              for l in w.layers]
    return ModelWeights(embed=qt(w.embed), layers=layers, out_norm=dev(w.out_norm), head=w.head.to_device(qt))


def device_free_bytes() -> int:
    """Free device memory, counting blocks CuPy's pool holds but does not use."""
    import cupy
    free, _ = cupy.cuda.runtime.memGetInfo()
    return int(free) + int(cupy.get_default_memory_pool().free_bytes())


def device_name() -> str:
    import cupy
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


class CudaExecutor:
    """decoder: a host Decoder (NumPy weights); its weights are uploaded here, once.
    n_cells: KV pool cells, or None to size the pool from the free memory after the weights, up
    to max_cells and at least min_cells. max_step_tokens: the widest eager step the memory
    estimate reserves scratch for. graphs: capture and replay static steps (off: run them eagerly
    from the same buffers). pdl: launch static steps' kernels with programmatic dependent launch
    where the device has it (sm_90+; kernels/launch.py). overlap: generate()'s default, whether
    decode steps are launched ahead of their tokens (launch() works either way)."""

    def __init__(self, decoder: Decoder, n_cells: int | None = None, *, max_cells: int = MAX_CELLS,
                 min_cells: int = 2, max_step_tokens: int = MAX_STEP_TOKENS, graphs: bool = True,
                 pdl: bool = True, overlap: bool = True):
        import cupy
        import cupyx

        cfg, w = decoder.cfg, decoder.w
        check_cuda_support(cfg, w)
        self.cfg = cfg
        self.graphs = graphs
        self.overlap = overlap
        self.pdl = pdl and int(cupy.cuda.Device().compute_capability) >= 90
        self.step_no = 0                       # steps run so far; error messages name the step
        # eager steps' scratch (default pool) and static steps' (their own pool) are both kept
        scratch = scratch_bytes(cfg, w, max_step_tokens) + scratch_bytes(cfg, w, MAX_STATIC)
        need_w, free = unique_weight_bytes(w), device_free_bytes()
        if need_w + scratch > free:
            raise GlimmerError(f"the model does not fit on the device: its weights need {_mb(need_w)} plus "
                               f"{_mb(scratch)} of step scratch, {_mb(free)} is free")
        try:
            self.decoder = Decoder(cfg, upload_weights(w))
            per_cell = cell_bytes(cfg)
            self.n_cells = size_pool(device_free_bytes(), per_cell, scratch, n_cells, max_cells, min_cells)
            shape = (self.n_cells, cfg.n_kv_heads, cfg.head_dim)
            self.kv = [(cupy.zeros(shape, cupy.uint16), cupy.zeros(shape, cupy.uint16)) for _ in range(cfg.n_layers)]
            if int(cupy.cuda.Device().compute_capability) >= 90:      # thread-block clusters of 16
                self.decoder.stack = DecodeStack.build(cfg, self.decoder.w, self.n_cells)
            cupy.cuda.get_current_stream().synchronize()
        except cupy.cuda.memory.OutOfMemoryError as e:
            raise GlimmerError(f"out of device memory while loading the model ({_mb(need_w)} of weights, "
                               f"{_mb(device_free_bytes())} free now): {e}") from None
        self.weight_bytes = need_w
        self.pool_bytes = self.n_cells * cell_bytes(cfg)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        # per slot: the ids a step samples (tokens, flags) on the device, where the next step's feed
        # reads them, and their pinned host copy; an event after the slot's latest launch
        rows = max(max_step_tokens, MAX_STATIC)
        self._ids = cupy.zeros((2, 2, rows), dtype=cupy.int32)
        self._ids_host = cupyx.empty_pinned((2, 2, rows), np.int32)
        self._events = [cupy.cuda.Event(disable_timing=True) for _ in range(2)]
        self._slots = Slots()
        self._static: dict[tuple[int, int, int, int, bool], StaticStep] = {}
        self._static_pool = cupy.cuda.MemoryPool()
        self.graph_replays = 0                 # static steps served by a graph (tests, stats)
        self.last_logits = None                # (K, vocab) device logits of the last launch's logit rows
                                               # (computed once its result is read)

    @contextlib.contextmanager
    def _reporting(self, what: str, step_no: int | None = None):
        errors = _cuda_errors()
        try:
            yield
        except errors as e:
            import cupy
            hint = ""
            if isinstance(e, (cupy.cuda.runtime.CUDARuntimeError, cupy.cuda.driver.CUDADriverError)):
                hint = (" (CUDA reports a faulting kernel at a later call, so the fault may be in an earlier op; "
                        "CUDA_LAUNCH_BLOCKING=1 with graphs off reports it at its launch)")
            msg = str(e).splitlines()[0] if str(e) else ""
            raise CudaStepError(f"step {self.step_no if step_no is None else step_no} ({what}), "
                                f"{where_failed(e.__traceback__)}: "
                                f"{type(e).__name__}: {msg}{hint}") from e

    @staticmethod
    def is_static(step: StepBatch) -> bool:
        """Whether the step runs as a static step (graphs): at most MAX_STATIC tokens, no mask."""
        return step.n_tokens <= MAX_STATIC and step.visible is None

    def upload_step(self, step: StepBatch) -> StepBatch:
        """The step with its arrays on the device: index arrays int32 from one host-to-device copy."""
        import cupy

        host, layout = pack_step(step)
        buf = cupy.asarray(host)
        arrays = {name: buf[a:b].reshape(shape) for name, a, b, shape in layout}
        visible = None if step.visible is None else cupy.asarray(np.ascontiguousarray(step.visible, np.bool_))
        return StepBatch(**arrays, visible=visible)

    def logits(self, step: StepBatch):
        """(K, vocab) float32 CuPy logits of the step's logit rows, run eagerly on the executor's
        stream, with the buckets of a static step when it is one. The host does not wait for the
        step; the caller's current stream does, so what it runs next on the logits (a `.get()`, any
        CuPy op) reads them finished."""
        import cupy

        self.step_no += 1
        check_step(step, self.n_cells, self.cfg.vocab)
        self._slots.forget()
        safe = graph_safe() if self.is_static(step) else contextlib.nullcontext()
        with self._reporting("forward"), self.stream, safe:
            logits = self.decoder.forward(self.upload_step(step), self.kv)
            done = self.stream.record()
        cupy.cuda.get_current_stream().wait_event(done)
        return logits

    def synchronize(self) -> None:
        """Wait for the steps launched so far (timings; a CUDA error surfaces here as CudaStepError)."""
        with self._reporting("synchronize"):
            self.stream.synchronize()

    def sample(self, logits, params, positions, ids=None) -> tuple[np.ndarray, np.ndarray]:
        """Host (tokens, flags) int32 (K,), from ops.sample_rows on the device and one small copy;
        ids: the (2, K) int32 device array to sample into (default: a new one). The executor's
        stream first waits for the caller's current one, so logits the caller has just changed there
        (a row masked, say) are read as changed."""
        import cupy

        caller = cupy.cuda.get_current_stream().record()
        self.stream.wait_event(caller)
        return self._sample_here(logits, params, positions, ids)

    def _sample_here(self, logits, params, positions, ids=None) -> tuple[np.ndarray, np.ndarray]:
        """sample() for logits the executor's stream has made (no wait for another stream)."""
        import cupy

        with self._reporting("sample"), self.stream:
            logits = cupy.asarray(logits)                     # no copy for device logits
            if ids is None:
                ids = cupy.empty((2, logits.shape[0]), dtype=cupy.int32)
            sample_rows(logits, params, positions, out=(ids[0], ids[1]))
            host = ids.get()                                  # the one device-to-host copy; waits for the step
        return host[0], host[1]

    def run_step(self, step: StepBatch, params, positions) -> tuple[np.ndarray, np.ndarray]:
        """Run a step and sample its logit rows: params (SamplingParams) and positions (the new
        tokens' positions, the RNG counters) one per logit row. Host (tokens, flags) int32 (K,)."""
        return self.launch(step, params, positions).result()

    def launch(self, step: StepBatch, params, positions, feed=None):
        """run_step without waiting: a handle whose result() is run_step's (tokens, flags). feed:
        per token row, -1 (the row's id in step.tokens) or j (row j of the ids the previous launch
        sampled, taken on the device). A static step returns once enqueued; an eager one when done."""
        k = len(step.logit_rows)
        if len(params) != k or len(positions) != k:
            raise GlimmerError(f"run_step: the step has {k} logit rows, got {len(params)} sampling parameters "
                               f"and {len(positions)} positions")
        feed = check_feed(feed, step.n_tokens, self._slots.prev_rows)
        if not self.is_static(step):
            return self._run_eager(step, params, positions, feed)
        return self._launch_static(step, params, positions, feed)

    def _run_eager(self, step: StepBatch, params, positions, feed) -> Ready:
        import cupy

        slot = self._slots.take(feed is not None)
        self.step_no += 1
        check_step(step, self.n_cells, self.cfg.vocab)
        k = len(step.logit_rows)
        with self._reporting("forward"), self.stream:
            dev = self.upload_step(step)
            if feed is not None:
                feed_tokens_(dev.tokens, cupy.asarray(feed), self._ids[1 - slot, 0])
            logits = self.last_logits = self.decoder.forward(dev, self.kv)
        if not k:
            done = Ready(np.zeros(0, np.int32), np.zeros(0, np.int32))
        elif k > self._ids.shape[2]:                          # more rows than a feed can take
            done, k = Ready(*self._sample_here(logits, params, positions)), 0
        else:                                                 # into the slot a fed step after this one reads
            done = Ready(*self._sample_here(logits, params, positions, ids=self._ids[slot, :, :k]))
        self._slots.launched(slot, done, k)
        return done

    def _launch_static(self, step: StepBatch, params, positions, feed) -> _Launched:
        import cupy

        slot = self._slots.take(feed is not None)
        self.step_no += 1
        check_step(step, self.n_cells, self.cfg.vocab)
        k = len(step.logit_rows)
        fed = feed is not None
        key = (step_width(step.n_tokens), step_width(k) if k else 0,
               table_width(step.cell_table.shape[1], self.n_cells), slot, fed)
        st = self._static.get(key)
        with self._reporting("static step"), self.stream:
            if st is None:
                st = self._static[key] = StaticStep(*key[:3], self._ids[slot], self._ids_host[slot],
                                                    self._ids[1 - slot, 0] if fed else None)
            st.fill(step, params, host_positions(positions, k, op="run_step"), self.cfg.vocab, feed)
            with graph_safe(), overlapped(self.pdl), cupy.cuda.using_allocator(self._static_pool.malloc):
                if not self.graphs or st.runs == 0:
                    self._static_body(st)
                else:
                    if st.graph is None:
                        st.graph = self._capture(st)
                    st.graph.launch(self.stream)
                    self.graph_replays += 1
            st.runs += 1
            self._events[slot].record(self.stream)
        self.last_logits = st.logits[:k]
        handle = _Launched(self, self.step_no, self._ids_host[slot], k, self._events[slot])
        self._slots.launched(slot, handle, k)
        return handle

    def replay_time_us(self, replays: int = 50) -> float:
        """GPU time of the most-run captured step: its graph replayed `replays` times back to back
        on the executor's stream (same inputs; each replay rewrites the same K/V cells), between
        CUDA events. Beside a step's host-timed duration it says how much of that is the host's.
        0.0 when no step has a graph yet."""
        import cupy

        done = [st for st in self._static.values() if st.graph is not None]
        if not done:
            return 0.0
        st = max(done, key=lambda s: s.runs)
        for h in self._slots.last:                       # replays rewrite the slots' ids: read them first
            if h is not None:
                h.result()
        self._slots.forget()                             # and leave the replays' samples to no feed
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        with self._reporting("graph replay"), self.stream:
            st.graph.launch(self.stream)                 # first replay outside the timing
            start.record(self.stream)
            for _ in range(replays):
                st.graph.launch(self.stream)
            end.record(self.stream)
            end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end) * 1e3 / replays

    def _static_body(self, st: StaticStep) -> None:
        """One static step on the executor's stream: upload, feed (a fed step), forward, sample,
        download the ids."""
        st.upload(self.stream)
        if st.feed_from is not None:
            feed_tokens_(st.d["tokens"], st.d["feed"], st.feed_from)
        st.logits = logits = self.decoder.forward(st.device_step(), self.kv)
        if st.k:
            sample_rows(logits, st.params, st.d["sample_pos"], out=(st.ids[0, :st.k], st.ids[1, :st.k]))
            st.download(self.stream)

    def _capture(self, st: StaticStep):
        import cupy

        rt = cupy.cuda.runtime
        self.stream.begin_capture(rt.streamCaptureModeRelaxed)
        try:
            self._static_body(st)
        except BaseException:
            with contextlib.suppress(Exception):
                self.stream.end_capture()
            raise
        return self.stream.end_capture()


class _Launched:
    """A static step on the device: result() waits for its event and reads its slot's pinned ids
    (once; Slots makes sure that happens before the slot is used again)."""

    __slots__ = ("_ex", "step_no", "_host", "k", "_event", "_result")

    def __init__(self, ex: CudaExecutor, step_no: int, host, k: int, event):
        self._ex, self.step_no, self._host, self.k, self._event = ex, step_no, host, k, event
        self._result = None

    @property
    def done(self) -> bool:
        """Whether the result has been read (not whether the device has finished)."""
        return self._result is not None

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        if self._result is None:
            with self._ex._reporting("waiting for its tokens", self.step_no):
                self._event.synchronize()
            self._result = (self._host[0, :self.k].copy(), self._host[1, :self.k].copy())
            self._host = self._event = None
        return self._result
