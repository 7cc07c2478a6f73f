"""Plot quant_matmul time against M per shape from a bench_quant_matmul.py JSON, beside cuBLAS fp16.

    python3 bench/plot_quant_matmul.py bench/results/quant_matmul.json bench/results/quant_matmul.png
"""

import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    src, dst = (argv or sys.argv[1:])[:2]
    data = json.loads(Path(src).read_text())
    rows = data["rows"]
    shapes = sorted({(r["n"], r["k"]) for r in rows if r["type"] in ("Q4_K", "Q6_K")}, key=lambda s: s[0] * s[1])
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.2 * len(shapes), 3.8), sharey=False)
    for ax, (n, k) in zip(axes, shapes):
        for q, color in (("Q4_K", "tab:blue"), ("Q6_K", "tab:orange")):
            rs = sorted((r for r in rows if r["type"] == q and (r["n"], r["k"]) == (n, k)), key=lambda r: r["m"])
            if not rs:
                continue
            ax.plot([r["m"] for r in rs], [r["us"] for r in rs], "o-", color=color, label=f"{q} quant_matmul")
            ax.plot([r["m"] for r in rs], [r["cublas_fp16_us"] for r in rs], "x--", color=color, alpha=0.6,
                    label=f"cuBLAS fp16 ({q} shape)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"N={n} K={k}")
        ax.set_xlabel("M (rows of x)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("µs per call")
    axes[0].legend(fontsize=7)
    meta = data["meta"]
    fig.suptitle(f"quant_matmul vs M — {meta['gpu']}, {meta['date']}, commit {meta['commit']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
