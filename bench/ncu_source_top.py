"""The SASS instructions that carry most of one column of an ncu source page, kernel by kernel.

    ncu --set full -k regex:NAME -c 1 -o REP python3 ...
    ncu -i REP.ncu-rep --page source --csv --print-source sass > SRC.csv
    python bench/ncu_source_top.py SRC.csv [--column "L2 Theoretical Sectors Global Excessive"] [--top 12]

Prints, per profiled kernel, the column's total, then the top instructions with their share, the
instructions executed and the sectors the column's ideal and theoretical siblings give (when the
page has them), so that "which load requests more sectors than its bytes need" is one command.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def kernels(path: Path) -> list[tuple[str, list[str], list[list[str]]]]:
    """(kernel name, header, rows) for each kernel block of the page."""
    out: list[tuple[str, list[str], list[list[str]]]] = []
    name, header, rows = "", [], []
    with open(path, newline="") as f:
        for r in csv.reader(f):
            if not r:
                continue
            if r[0] == "Kernel Name":
                if header:
                    out.append((name, header, rows))
                name, header, rows = r[1] if len(r) > 1 else "?", [], []
            elif r[0] == "Address" and not header:
                header = r
            elif header:
                rows.append(r)
    if header:
        out.append((name, header, rows))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--column", action="append", default=[],
                    help="column to rank by (repeatable; default: the global sectors' excess and the stall samples)")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args(argv)
    columns = args.column or ["L2 Theoretical Sectors Global Excessive", "Warp Stall Sampling (All Samples)"]
    blocks = kernels(args.csv)
    if not blocks:
        print(f"{args.csv}: no 'Kernel Name' / 'Address' blocks (not an ncu --page source --csv file)", file=sys.stderr)
        return 1
    for name, header, rows in blocks:
        print(f"## {name}: {len(rows)} instructions")
        idx = {c: i for i, c in enumerate(header)}
        extra = [c for c in ("Instructions Executed", "L2 Theoretical Sectors Global",
                             "L2 Theoretical Sectors Global Ideal") if c in idx]
        for col in columns:
            if col not in idx:
                print(f"  column '{col}' not on this page")
                continue
            i = idx[col]
            vals = [(number(r[i]), r) for r in rows if len(r) > i]
            total = sum(v for v, _ in vals)
            sums = ", ".join(f"{c} {sum(number(r[idx[c]]) for r in rows if len(r) > idx[c]):,.0f}" for c in extra)
            print(f"  {col}: total {total:,.0f} ({sums})")
            for v, r in sorted(vals, key=lambda x: -x[0])[: args.top]:
                if v <= 0:
                    break
                more = " ".join(f"{c.split()[-1] if c != 'Instructions Executed' else 'exec'}={r[idx[c]]}"
                                for c in extra)
                print(f"    {v:12,.0f} {v / total:6.1%}  {r[idx['Source']].strip()[:90]}  {more}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
