"""Sum an ncu CSV (--csv --metrics gpu__time_duration.sum) by kernel name: a markdown table of the
kernels of one profiled decode step, largest first (used by bench/decode_breakdown.sh).

    python bench/ncu_summary.py NCU.csv [--title TEXT]
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import defaultdict
from pathlib import Path


def short(name: str) -> str:
    """'void gemv_dp4a_kernel<gguf::Q4_K, 1>(float *, ...)' -> 'gemv_dp4a_kernel<Q4_K, 1>'."""
    name = re.sub(r"\(.*$", "", name).removeprefix("void ").replace("gguf::", "")
    return name.strip()


def summarize(path: Path) -> tuple[list[tuple[str, int, float]], float]:
    total: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    head = next(i for i, r in enumerate(rows) if "Kernel Name" in r and "Metric Value" in r)
    cols = rows[head]
    k, unit, value = cols.index("Kernel Name"), cols.index("Metric Unit"), cols.index("Metric Value")
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
    for r in rows[head + 1:]:
        if len(r) <= value or not r[value].replace(",", "").replace(".", "").isdigit():
            continue
        us = float(r[value].replace(",", "")) * scale.get(r[unit], 1e-3)
        total[short(r[k])] += us
        calls[short(r[k])] += 1
    out = sorted(((n, calls[n], t) for n, t in total.items()), key=lambda x: -x[2])
    return out, sum(total.values())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--title", default="One decode step, kernels by name (ncu gpu__time_duration)")
    args = ap.parse_args(argv)
    rows, whole = summarize(args.csv)
    n = sum(c for _, c, _ in rows)
    print(f"## {args.title}\n\n{n} kernels, {whole:.1f} µs of kernel time\n")
    print("| kernel | calls | µs | share |\n|---|---|---|---|")
    for name, c, t in rows:
        print(f"| `{name}` | {c} | {t:.1f} | {t / whole:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
