"""A/B of mma_wg.cu's commit-group size: one process per GLIMMER_WG_PAIRS value (k-step pairs a
fence), each running bench_quant_matmul.py's arguments on the table's bucket (mma_wg above 32 rows).

    PYTHONPATH=$PWD python3 bench/ab_mma_wg_pairs.py 1,2,4 --types Q4_K --ms 128,512 --no-baselines
"""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        from glimmer_cupy.kernels import build
        build._EXTRA_DEFINES.append(("GLIMMER_WG_PAIRS", int(sys.argv[2])))
        sys.argv = ["bench_quant_matmul.py"] + sys.argv[3:]
        runpy.run_path(str(Path(__file__).with_name("bench_quant_matmul.py")), run_name="__main__")
        return 0
    for p in sys.argv[1].split(","):
        print(f"== GLIMMER_WG_PAIRS={p}", flush=True)
        subprocess.run([sys.executable, __file__, "--one", p] + sys.argv[2:], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
