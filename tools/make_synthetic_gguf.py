"""Write a GGUF file with random weights and the exact tensor shapes of a Qwen3 model (timing only;
glimmer_cupy/weights/synthetic.py says what the file holds).

    python tools/make_synthetic_gguf.py --model qwen3-8b --out /tmp/qwen3-8b-synthetic.gguf
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not

from glimmer_cupy.weights.synthetic import CONFIGS, write_synthetic_gguf


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, choices=list(CONFIGS))
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=None, help="override the layer count (small test files)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    path = write_synthetic_gguf(args.model, args.out, seed=args.seed, layers=args.layers)
    dt = time.perf_counter() - t0
    size = path.stat().st_size
    print(f"{path}: {size / 1e9:.3f} GB in {dt:.2f} s ({size / 1e6 / dt:.0f} MB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
