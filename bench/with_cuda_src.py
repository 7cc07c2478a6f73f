"""Run a script or module with every kernel compiled from another tree's cuda_src, for an A/B of
kernel sources in one call (the other tree copied beside this one, e.g. `git archive REV cuda_src |
tar x -C /tmp/old`). The build layer reads kernels.build.CUDA_SRC at each compile and its disk
cache keys on the sources, so both trees' builds stay cached side by side.

    python3 bench/with_cuda_src.py /tmp/old/cuda_src bench/probe_q6k_pairs.py --ms 16
    python3 bench/with_cuda_src.py /tmp/old/cuda_src -m glimmer_cupy.cli bench decode --synthetic qwen3-8b
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import glimmer_cupy.kernels.build as build  # noqa: E402


def main(argv: list[str]) -> None:
    if len(argv) < 2 or (argv[1] == "-m" and len(argv) < 3):
        sys.exit("usage: with_cuda_src.py CUDA_SRC (SCRIPT | -m MODULE) [ARGS...]")
    src = Path(argv[0]).resolve()
    if src.name != "cuda_src" or not (src / "quant_blocks.cuh").is_file():
        sys.exit(f"with_cuda_src: {src} is not a cuda_src folder")
    build.CUDA_SRC = src
    print(f"kernels from {src}", flush=True)
    if argv[1] == "-m":
        sys.argv = argv[2:]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        if not Path(argv[1]).is_file():
            sys.exit(f"with_cuda_src: no script {argv[1]}")
        sys.argv = argv[1:]
        runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
