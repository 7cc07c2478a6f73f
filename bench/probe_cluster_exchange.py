"""What an all-gather between the blocks of one cluster costs (cuda_src/xchg_probe.cu): the step a
decoder layer run by a single cluster would take after each of its matmuls, instead of a kernel
boundary (~1 µs under PDL, bench/probe_dep_wait.py). For each cluster size and mode, a chain of
--layers x len(sizes) dependent exchanges in one launch; µs an exchange from the blocks' global
timer, and the launch's own time by CUDA events, the chain's last vector checked against NumPy.
  barrier  remote stores, then the cluster barrier
  async    st.async counted in bytes on the receiver's mbarrier (no barrier across the cluster)

    PYTHONPATH=$PWD python3 bench/probe_cluster_exchange.py [--clusters 4,8,16] [--sizes 960,576,...] [--out F]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy.benchmarks.timing import run_meta  # noqa: E402
from glimmer_cupy.kernels.build import get_kernel  # noqa: E402
from glimmer_cupy.kernels.launch import allow_large_clusters, launch_cluster  # noqa: E402

MODES = {"barrier": 0, "async": 1}
NAMES = ("xchg_chain<0>", "xchg_chain<1>")
# a SmolLM2 layer's vectors: q|k|v, attention's rows, o, the normed input, gate/up's product, down
SMOLLM2 = (960, 576, 576, 576, 1536, 576)


def expected(sizes, layers: int) -> np.ndarray:
    """The chain's last vector, as the kernel makes it (float32)."""
    nmax = max(sizes)
    prev = np.ones(nmax, np.float32)
    for layer in range(layers):
        for n in sizes:
            i = np.arange(n)
            prev = prev[(i * 7 + layer) % prev.shape[0]] * np.float32(0.5) + np.float32(0.25)
    return prev


def run(mode: str, c: int, sizes, layers: int, reps: int) -> dict:
    import cupy
    kern = get_kernel("xchg_probe", NAMES[MODES[mode]], name_expressions=NAMES)
    allow_large_clusters(kern.fn)
    smem = 2 * max(sizes) * 4
    out = cupy.zeros(2 * c, np.float32)
    sz = cupy.asarray(np.array(sizes, np.int32))
    args = (out, np.int32(layers), np.int32(len(sizes)), sz)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    launch_cluster(kern, (c,), (512,), args, smem, (c, 1, 1))
    cupy.cuda.Device().synchronize()
    ev, inner = [], []
    for _ in range(reps):
        start.record()
        launch_cluster(kern, (c,), (512,), args, smem, (c, 1, 1))
        end.record()
        end.synchronize()
        ev.append(cupy.cuda.get_elapsed_time(start, end) * 1e3)
        inner.append(float(cupy.asnumpy(out)[1::2].max()) / 1e3)
    want = float(expected(sizes, layers).sum(dtype=np.float32))
    got = cupy.asnumpy(out)[0::2]
    if not np.allclose(got, want, rtol=1e-4):
        raise SystemExit(f"{mode} C={c}: the chain's last vector sums to {got} on the blocks, NumPy {want}")
    nx = layers * len(sizes)
    return dict(mode=mode, cluster=c, exchanges=nx, us_exchange=float(np.median(inner)) / nx,
                us_launch=float(np.median(ev)), us_chain=float(np.median(inner)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clusters", default="4,8,16")
    ap.add_argument("--sizes", default=",".join(map(str, SMOLLM2)), help="floats a vector, at most 8")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    sizes = [int(s) for s in a.sizes.split(",")]
    rows = []
    print(f"# {a.layers} layers x vectors {sizes}; µs an exchange (median of {a.reps} launches)", flush=True)
    print(f"{'mode':>8} {'C':>3} {'µs/xchg':>8} {'chain µs':>9} {'launch µs':>10}", flush=True)
    for c in (int(x) for x in a.clusters.split(",")):
        if any(n % (4 * c) for n in sizes):
            raise SystemExit(f"--sizes: every size must be a multiple of 4 x cluster {c}, got {sizes}")
        for mode in MODES:
            r = run(mode, c, sizes, a.layers, a.reps)
            rows.append(r)
            print(f"{mode:>8} {c:>3} {r['us_exchange']:>8.3f} {r['us_chain']:>9.1f} {r['us_launch']:>10.1f}",
                  flush=True)
    if a.out:
        a.out.write_text(json.dumps(dict(meta=run_meta(), sizes=sizes, layers=a.layers, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
