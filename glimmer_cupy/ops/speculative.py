"""Speculative verification and plain sampling behind one entry point (rules in
reference/speculative.py; kernel: cuda_src/speculative.cu). NumPy logits run the reference; CuPy
logits run verify_init (which also lists the greedy rows and the others), then verify_greedy_<i32|i64>
for the greedy rows (S small items per (position, row), no clusters) and verify_<i32|i64>_c<C> for
the others (one cluster of C blocks per (position, row) item), each kernel's resident blocks taking
its items from a queue in position-major order, the positions joined by a per-row stop word (see
speculative.cu); or sample_rows' launch when there are no drafts. n_accepted and flags serve as the
rows' stop words and done counts during the launch, so they must be distinct arrays.

    n_accepted, tokens, flags = sample_token(logits, params, positions)              # plain step
    n_accepted, tokens, flags = sample_token(logits, params, positions, drafts, q)   # verify

Row r's new tokens are tokens[r, :n_accepted[r] + 1]: the accepted drafts, then the correction or
the bonus. The runtime calls this for every row of every step; plain sampling gives exactly
sample_rows' tokens (tokens[:, 0]).

What is checked where. On the host (ValueError naming the op, the argument and the value, before
any launch): shapes, dtypes, contiguity, the array class of every argument, params (a list of
SamplingParams, or a DeviceSamplingParams checked for shape/dtype), and the values of every
argument given as host data (drafts in [0, vocab), draft_probs finite and >= 0, n_drafts in
[0, n], positions). Values inside CuPy arrays (drafts, draft_probs, n_drafts, positions, the
DeviceSamplingParams) are not read on the host, since that would wait for the device: the kernel
keeps every read in bounds and every token a valid id (a draft outside [0, vocab) is rejected
unread and flagged INVALID_DRAFT = 4, n_drafts is clamped to [0, n], a NaN or negative q acts as
0), but the law of the tokens is only the reference's for valid inputs.

On the device the tokens equal the reference's except where a decision sits within float32
rounding (~1e-6 relative) of its threshold: the kernel's p is sampling.cu's (float32 exp, integer
weights of 2^-40 of the top token), the reference's float64. Sums are integers, so the result does
not depend on the batch, the launch shape, or graph replay.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from ..kernels.build import get_kernel, sm_count
from ..reference import speculative as ref
from ._check import F32, I32, check, check_out, fail
from ._dispatch import host_result, is_host, no_kernel
from .sampling import DeviceSamplingParams, check_params, host_positions, sample_rows

__all__ = ["INVALID_DRAFT", "sample_token"]

OP = "sample_token"
INTS = (np.dtype(np.int32), np.dtype(np.int64))
INVALID_DRAFT = 4           # flag bit (device inputs only): a draft id outside [0, vocab), rejected unread
VERIFY_CLUSTERS = (1, 2, 4, 8)             # the C of verify_*_c<C>: blocks per (position, row)
VERIFY_MIN_BLOCKS = 264                     # spread few rows over at least two blocks per SM (132 on an H200)
GREEDY_THREADS = 256                        # kGreedyThreads in speculative.cu
INIT_THREADS = 1024                         # kInitThreads
VERIFY_BUILD_THREADS = 1024                 # VERIFY_THREADS in speculative.cu: the default build's block
VERIFY_THREADS: int | None = None           # the cluster kernel's block size; None: verify_threads' rule
VERIFY_FEW_IDS = 65536                      # a block's chunk up to which the 512-thread build runs
GREEDY_IDS = 16384                          # ids per block of verify_greedy (64 KB of logits)
KEPT_BYTES_PER_THREAD = 24                  # kKeptBytes / kThreads (sampling_topk.cuh's KeptFloat4)


def greedy_slices(vocab: int) -> tuple[int, int]:
    """(S, per) for verify_greedy: S blocks per (position, row), each over `per` ids (a multiple
    of 4, so that an aligned row is read in float4)."""
    s = max(1, -(-vocab // GREEDY_IDS))
    return s, (-(-vocab // s) + 3) // 4 * 4


_slots: dict = {}


def _verify_slots(rows: int, n1: int):
    """The verification's device state: (best, done, queues, lists). best u64 and done int32 are
    verify_greedy's per-position slots (rows * n1 each), done followed by each row's early end;
    queues the two kernels' item counters (the cluster kernel's, verify_greedy's) and the count of
    verify_greedy's blocks that left (its last one decides the greedy rows); lists the rows
    at temperature > 0 and the others (counts, then rows * 2 ids). One persistent set per (device,
    stream, shape): verify_init resets and fills them on the stream before each use, and a
    captured graph keeps pointing at the same memory."""
    import cupy
    key = (cupy.cuda.Device().id, cupy.cuda.get_current_stream().ptr, rows, n1)
    if key not in _slots:
        ints = cupy.zeros(rows * (n1 + 1) + 3 + 2 + 2 * rows, np.int32)
        done_n = rows * (n1 + 1)
        _slots[key] = (cupy.zeros(rows * n1, np.uint64), ints[:done_n], ints[done_n:done_n + 3], ints[done_n + 3:])
    return _slots[key]


def chunk_ids(vocab: int, c: int) -> int:
    """The most ids a block of a C-block cluster covers (speculative.cu's chunk4)."""
    return (-(-vocab // c) + 3) // 4 * 4


def verify_shape(rows: int, n: int, vocab: int, smem_budget: int, sms: int) -> tuple[int, int]:
    """(C, cache) for a verification: C blocks per (position, row). One block an item once the
    (n + 1) * rows items are at least half the `sms` SMs: most items are then decided from a short
    list (one read of the row and one gather), so more items at once beat more SMs an item (vocab
    151936, 16 positions: 64 rows 155.8 us at C = 1, 199.7 at 2, 263.6 at 4, 408.1 at 8; 8 rows
    48.5, 70.2, 65.2, 86.8; one row 39.5, 37.0, 32.1, 37.3; bench/results/verify_probe_df76d63.txt
    and verify_probe_ed24e78.txt). Fewer items: the smallest C whose chunk (plus 4 floats of slack)
    fits in smem_budget bytes of dynamic shared memory, so that the long path's filtering passes
    read it there, raised while the grid has fewer than VERIFY_MIN_BLOCKS blocks. cache = the
    chunk in floats, or 0 when it does not fit (the passes then read global memory). No result
    depends on either."""
    items = (n + 1) * rows
    fits = [c for c in VERIFY_CLUSTERS if 4 * (chunk_ids(vocab, c) + 4) <= smem_budget]
    if 2 * items >= sms:
        return 1, chunk_ids(vocab, 1) if 1 in fits else 0
    c = fits[0] if fits else VERIFY_CLUSTERS[-1]
    while c < VERIFY_CLUSTERS[-1] and items * c < VERIFY_MIN_BLOCKS:
        c *= 2
    return c, chunk_ids(vocab, c) if c in fits else 0


def verify_threads(vocab: int, c: int) -> int:
    """Threads a block of the cluster kernel at C blocks an item: 512 (speculative.cu built with
    VERIFY_THREADS=512) where a block's chunk is at most VERIFY_FEW_IDS ids, else 1024. Measured
    on the H200 (stochastic verification of 16-token blocks with q, µs at 512 / 1024 threads,
    bench/results/probe_verify_threads_7ffe144.txt): one row (C = 8) 23.5 / 27.7 at vocab 49152,
    25.5 / 28.7 at 151936, 26.6 / 42.2 at 262144; four rows (C = 8) 30.0-30.5 / 34.3-36.6; eight
    rows (C = 1) 22.4 / 23.4 at 49152 but 48.1 / 45.5 at 151936 and 68.7 / 59.2 at 262144, where a
    block reads a whole row (64 rows at 151936: 129.3 / 103.2, probe_verify_threads_d06099c.txt)."""
    return 512 if chunk_ids(vocab, c) <= VERIFY_FEW_IDS else VERIFY_BUILD_THREADS


def verify_defines(threads: int) -> dict | None:
    """speculative.cu's compile-time switches for the cluster kernel at `threads` a block (None: the
    default build)."""
    return None if threads == VERIFY_BUILD_THREADS else {"VERIFY_THREADS": threads}


def verify_clusters(rows: int, n: int, c: int, smem: int, threads: int = VERIFY_BUILD_THREADS) -> int:
    """Clusters of the cluster kernel's launch: one an item at most, and about as many as fit at
    once by threads and shared memory an SM (its clusters take their items from a queue: the ones
    that do not fit start when the first leave, at the queue's end, and find it empty)."""
    import cupy
    per_sm_smem, static = _smem_limits(cupy.cuda.Device().id)[1:]
    by_smem = per_sm_smem // (smem + static + 1024)           # 1 KB reserved a block
    per_sm = max(1, min(2048 // threads, by_smem))
    return max(1, min((n + 1) * rows, per_sm * sm_count() // c))


def _resident_greedy_blocks(kernel) -> int:
    """verify_greedy blocks the device holds at once (the driver's occupancy of this build, by its
    registers and shared memory): the launch's size, since its blocks take their items from a queue.
    More would start only when the first ones leave, at the queue's end, and would hold back a
    dependent launch, which waits for every block to have started."""
    return _blocks_per_sm(kernel.ptr, GREEDY_THREADS) * sm_count()


@cache
def _blocks_per_sm(fn_ptr: int, threads: int) -> int:
    from cupy_backends.cuda.api import driver
    return max(1, driver.occupancyMaxActiveBlocksPerMultiprocessor(fn_ptr, threads, 0))


@cache
def _smem_limits(device_id: int) -> tuple[int, int, int]:
    """(opt-in shared memory a block may take, shared memory an SM has, the cluster kernel's static
    shared memory, the same for every C), read once per device."""
    import cupy
    attrs = cupy.cuda.Device(device_id).attributes
    static = get_kernel("speculative", "verify_i32_c1").fn.shared_size_bytes
    return attrs["MaxSharedMemoryPerBlockOptin"], attrs["MaxSharedMemoryPerMultiprocessor"], static


def _smem_budget(device_id: int) -> int:
    """Dynamic shared memory a verify block may take: the opt-in limit per block less the
    kernel's static shared memory."""
    optin, _, static = _smem_limits(device_id)
    return optin - static


def _check_draft_ids(drafts: np.ndarray, vocab: int) -> None:
    if drafts.size and (drafts.min() < 0 or drafts.max() >= vocab):
        raise fail(OP, "drafts", f"token ids in [0, {vocab})", int(drafts.min() if drafts.min() < 0 else drafts.max()))


def _host_n_drafts(n_drafts, rows: int, n: int) -> np.ndarray:
    """n_drafts given on the host, checked: (rows,) integers in [0, n]."""
    k = np.asarray(n_drafts)
    if k.shape != (rows,) or k.dtype.kind not in "iu":
        raise fail(OP, "n_drafts", f"{rows} integers", f"{k.dtype.name} {k.shape}")
    if rows and (k.min() < 0 or k.max() > n):
        raise fail(OP, "n_drafts", f"in [0, {n}]", int(k.min() if k.min() < 0 else k.max()))
    return k


def _host_positions(positions, rows: int, n: int) -> np.ndarray:
    """positions given on the host, checked, with room for the n drafted positions after them."""
    pos = host_positions(positions, rows, OP)
    if rows and int(pos.max()) + n >= 2 ** 31:
        raise fail(OP, "positions", f"below 2^31 - {n} (the last drafted position must fit)", int(pos.max()))
    return pos


def sample_token(logits, params, positions, drafts=None, draft_probs=None, *, n_drafts=None, out=None):
    """logits (rows, vocab) with drafts None, or (rows, n+1, vocab) float32 with drafts (rows, n)
    int32|int64; draft_probs None (point-mass drafts) or (rows, n, vocab) float32, finite, >= 0;
    params one SamplingParams per row; positions (rows,) ints, the position of each row's first
    new token; n_drafts (rows,) ints in [0, n] or None (all n); out an optional (n_accepted,
    tokens, flags) triple of int32 (rows,), (rows, n+1), (rows,).
    -> (n_accepted, tokens, flags), tokens padded with -1 after each row's n_accepted + 1.
    On CuPy logits: params a list of SamplingParams or a DeviceSamplingParams; positions, drafts
    and n_drafts host data (checked, uploaded) or int32 (drafts: int32|int64) device arrays (used
    as they are: graph-safe); draft_probs a CuPy array or None; out CuPy int32 arrays."""
    if not is_host(logits):
        return _device(logits, params, positions, drafts, draft_probs, n_drafts, out)
    for a in (drafts, draft_probs):
        if a is not None and not is_host(a) and type(a).__module__.split(".")[0] == "cupy":
            raise fail(OP, "drafts and draft_probs", "NumPy arrays like logits", type(a).__module__)
    if drafts is None:
        check(logits, OP, "logits", dtypes=(F32,), shape=("rows", "vocab"))
        if draft_probs is not None or n_drafts is not None:
            raise fail(OP, "draft_probs and n_drafts", "None without drafts", "an argument")
        rows, vocab = logits.shape
        n = 0
    else:
        check(logits, OP, "logits", dtypes=(F32,), shape=("rows", "n+1", "vocab"))
        rows, n1, vocab = logits.shape
        n = n1 - 1
        check(drafts, OP, "drafts", dtypes=INTS, shape=(rows, n))
        _check_draft_ids(drafts, vocab)
        if draft_probs is not None:
            check(draft_probs, OP, "draft_probs", dtypes=(F32,), shape=(rows, n, vocab))
            if not np.all(np.isfinite(draft_probs) & (draft_probs >= 0)):
                raise fail(OP, "draft_probs", "finite and >= 0", "a negative or non-finite entry")
        if n_drafts is not None:
            _host_n_drafts(n_drafts, rows, n)
    if vocab == 0:
        raise fail(OP, "logits", "at least one column", f"{logits.shape}")
    check_params(params, rows, vocab, OP)
    pos = _host_positions(positions, rows, n)
    result = ref.sample_token(logits, list(params), pos, drafts, draft_probs, n_drafts)
    if out is None:
        return result
    for o, r in zip(out, result):
        check_out(o, OP, r.shape, np.int32)
    return tuple(host_result(r, o) for r, o in zip(result, out))


def _device(logits, params, positions, drafts, draft_probs, n_drafts, out):
    try:
        import cupy
    except ImportError:
        cupy = None
    if cupy is None or not isinstance(logits, cupy.ndarray):
        raise no_kernel(OP, logits)
    if drafts is None:
        check(logits, OP, "logits", dtypes=(F32,), shape=("rows", "vocab"))
        if draft_probs is not None or n_drafts is not None:
            raise fail(OP, "draft_probs and n_drafts", "None without drafts", "an argument")
        rows = logits.shape[0]
        if out is None:
            out = (cupy.empty(rows, np.int32), cupy.empty((rows, 1), np.int32), cupy.empty(rows, np.int32))
        for o, shape in zip(out, ((rows,), (rows, 1), (rows,))):
            check_out(o, OP, shape, I32, like=logits)
        out[0].fill(0)
        sample_rows(logits, params, positions, out=(out[1].reshape(rows), out[2]))
        return out

    check(logits, OP, "logits", dtypes=(F32,), shape=("rows", "n+1", "vocab"))
    rows, n1, vocab = logits.shape
    n = n1 - 1
    if vocab == 0:
        raise fail(OP, "logits", "at least one column", f"{logits.shape}")
    if isinstance(drafts, cupy.ndarray):
        check(drafts, OP, "drafts", dtypes=INTS, shape=(rows, n), like=logits)
    else:
        drafts = np.asarray(drafts)
        check(drafts, OP, "drafts", dtypes=INTS, shape=(rows, n))
        _check_draft_ids(drafts, vocab)
        drafts = cupy.asarray(drafts)
    if draft_probs is not None:
        check(draft_probs, OP, "draft_probs", dtypes=(F32,), shape=(rows, n, vocab), like=logits)
    if n_drafts is None or isinstance(n_drafts, cupy.ndarray):
        if n_drafts is not None:
            check(n_drafts, OP, "n_drafts", dtypes=(I32,), shape=(rows,), like=logits)
    else:
        n_drafts = cupy.asarray(_host_n_drafts(n_drafts, rows, n).astype(np.int32))
    host_params = None
    if isinstance(params, DeviceSamplingParams):
        params.check(rows, logits, OP)
    else:
        host_params = list(params)
        params = DeviceSamplingParams.from_params(host_params, vocab)
    if isinstance(positions, cupy.ndarray):
        check(positions, OP, "positions", dtypes=(I32,), shape=(rows,), like=logits)
    else:
        positions = cupy.asarray(_host_positions(positions, rows, n))
    if out is None:
        out = (cupy.empty(rows, np.int32), cupy.empty((rows, n + 1), np.int32), cupy.empty(rows, np.int32))
    for o, shape in zip(out, ((rows,), (rows, n + 1), (rows,))):
        check_out(o, OP, shape, I32, like=logits)
    if rows and out[0].data.ptr == out[2].data.ptr:
        raise fail(OP, "out", "distinct n_accepted and flags arrays", "the same array twice")
    if rows:
        c, cache = verify_shape(rows, n, vocab, _smem_budget(logits.device.id), sm_count())
        kind = "i64" if drafts.dtype == np.int64 else "i32"
        best, done, queues, lists = _verify_slots(rows, n + 1)
        k_arg = positions if n_drafts is None else n_drafts
        get_kernel("speculative", "verify_init")(
            (1,), (INIT_THREADS,),
            (out[0], out[2], k_arg, params.temperature, best, done, queues, lists, np.int32(rows), np.int32(n),
             np.int32(n_drafts is not None)))
        # greedy rows on verify_greedy, the others on the cluster kernel; both launch unless the
        # parameters are a host list that says one of them has no row (device parameters may change
        # under a captured graph)
        greedy = None if host_params is None else [not (p.temperature > 0) for p in host_params]
        if greedy is None or any(greedy):
            slices, per = greedy_slices(vocab)
            greedy_kern = get_kernel("speculative", f"verify_greedy_{kind}")
            greedy_kern(
                (min((n + 1) * rows * slices, _resident_greedy_blocks(greedy_kern)),), (GREEDY_THREADS,),
                (out[0], out[1], out[2], logits, drafts, k_arg, best, done, np.int32(rows),
                 np.int32(n), np.int32(vocab), np.int32(n_drafts is not None), np.int32(slices), np.int32(per),
                 queues[1:], lists))
        if greedy is None or not all(greedy):
            _launch_clusters(f"verify_{kind}_c{c}", c, cache, out, logits, drafts, draft_probs, k_arg, params,
                             positions, n_drafts is not None, queues, lists)
    return tuple(out)


def _launch_clusters(name: str, c: int, cache: int, out, logits, drafts, draft_probs, k_arg, params, positions,
                     has_n_drafts: bool, queues, lists) -> None:
    """The cluster kernel's launch over the rows at temperature > 0 (verify_init listed them)."""
    rows, n1, vocab = logits.shape
    threads = VERIFY_THREADS or verify_threads(vocab, c)
    kern = get_kernel("speculative", name, verify_defines(threads))
    smem = 4 * (cache + 4)
    if c == 1:                  # the dynamic region also holds each thread's kept float4 (short lists)
        smem = max(smem, KEPT_BYTES_PER_THREAD * threads)
    if kern.fn.max_dynamic_shared_size_bytes < smem:
        kern.fn.max_dynamic_shared_size_bytes = smem        # above the default 48 KB
        kern.fn.preferred_shared_memory_carveout = 100
    kern((verify_clusters(rows, n1 - 1, c, smem, threads) * c,), (threads,),
         (out[0], out[1], out[2], logits, drafts, logits if draft_probs is None else draft_probs,
          k_arg, params.temperature, params.top_k, params.top_p,
          params.min_p, params.seed, positions, np.int32(rows), np.int32(n1 - 1), np.int32(vocab),
          np.int32(draft_probs is not None), np.int32(has_n_drafts), np.int32(cache),
          queues, lists),
         shared_mem=smem)
