"""quant_matmul on Q6_K matrices in GGUF order against the same matrices in pair order
(weights/q6k_pairs.py): the bits, and the time of each in a PDL graph with the weights rotated
past L2 and x's int8 codes made beforehand (as in a model), arms alternated, with the copy rate of
the same run. M = 1 runs gemv_kq, M = 8..64 mma_st.

    python3 bench/probe_q6k_pairs.py [--shapes NxK,...] [--ms 1,16] [--rounds 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glimmer_cupy import ops  # noqa: E402
from glimmer_cupy.benchmarks.matmul_sets import parse_shapes, weight_sets  # noqa: E402
from glimmer_cupy.benchmarks.timing import copy_bandwidth, run_meta, time_us  # noqa: E402
from glimmer_cupy.kernels.launch import overlapped  # noqa: E402
from glimmer_cupy.ops import matmul  # noqa: E402
from glimmer_cupy.ops.matmul import TRAITS, quantize_x  # noqa: E402
from glimmer_cupy.ops.q8 import Q8Rows  # noqa: E402
from glimmer_cupy.weights import q6k_pairs  # noqa: E402
from glimmer_cupy.weights.quant_tensor import QType  # noqa: E402

SHAPES = ((151936, 4096), (4096, 12288), (1024, 4096), (4096, 4096), (12288, 4096), (3072, 1024))


def main(argv=None) -> int:
    import cupy
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="", help="NxK,... (default: Qwen3-8B's Q6_K shapes and a few more)")
    ap.add_argument("--ms", default="1,16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--launches", type=int, default=50)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    shapes = parse_shapes(a.shapes, SHAPES)
    ms = [int(v) for v in a.ms.split(",")]
    rng = np.random.default_rng(5)
    copy = copy_bandwidth()
    print(f"copy {copy / 1e12:.2f} TB/s", flush=True)
    rows, ok = [], True
    for n, k in shapes:
        ws = weight_sets(QType.Q6_K, n, k, rng)
        arms = {"gguf": ws, "pairs": [q6k_pairs.repack(w) for w in ws]}
        if arms["pairs"][0].layout != q6k_pairs.LAYOUT:
            print(f"{n}x{k}: not servable in pair order; skipped")
            continue
        nbytes = ws[0].data.nbytes
        for m in ms:
            xs = [cupy.asarray(rng.normal(0, 1, (m, k)).astype(np.float32)) for _ in ws]
            codes = [Q8Rows(x, *quantize_x(x, TRAITS[QType.Q6_K])) for x in xs] if m == 1 else xs
            outs = [cupy.empty((m, n), np.float32) for _ in ws]
            got = {name: cupy.asnumpy(ops.quant_matmul(codes[0], w[0])) for name, w in arms.items()}
            same = bool(np.array_equal(got["pairs"], got["gguf"]))
            ok &= same
            times = {name: [] for name in arms}
            for _ in range(a.rounds):
                for name, w in arms.items():
                    with overlapped(True):
                        times[name].append(time_us(lambda i: ops.quant_matmul(codes[i], w[i], out=outs[i]), len(ws),
                                                   a.launches, a.reps)[0])
            row = dict(n=n, k=k, m=m, bucket=matmul.bucket(m, QType.Q6_K, True), bytes=nbytes, bits_equal=same, us=times)
            rows.append(row)
            line = " | ".join(f"{name} {min(v):7.1f} us ({nbytes / min(v) / 1e-6 / copy:4.0%})" for name, v in times.items())
            print(f"{n:>6}x{k:<6} M={m:<3} {row['bucket']:8s} bits {'same' if same else 'DIFFER'} | {line} | "
                  + " ".join(f"{name} " + "/".join(f"{t:.1f}" for t in v) for name, v in times.items()), flush=True)
    if a.out:
        a.out.write_text(json.dumps(dict(meta=run_meta(copy_bytes_per_s=copy), rows=rows), indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
