"""Every GPU test (`pytest -m gpu`) in several pytest processes at once, so that the kernels they
build compile on several cores (a cold kernel cache makes the first run of the whole suite mostly
NVRTC time, far past a single process's minutes). Tests are dealt to shards by file, a file of more
than --split tests in parts of about that many, so that a shard compiles mostly its own modules;
the disk cache (kernels/build.py) is shared, so a module two shards need is compiled by whichever
gets there first and read by the other once it is written.

Each shard's full log goes to OUT/shard_N.log; the summary (each shard's counts and every failed or
erroring test) is printed and written to OUT/summary.txt. Exit status 1 if any test failed, erred
or a shard ran out of time.

    PYTHONPATH=$PWD python3 bench/run_gpu_tests.py --out DIR [--jobs 8] [--split 160] [--limit 540] [PYTEST_ARGS...]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTEST = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider"]


def collect(extra: list[str]) -> list[str]:
    """The node ids of the GPU tests (pytest's collection, in file order)."""
    run = subprocess.run(PYTEST + ["--collect-only"] + (extra or ["tests"]), cwd=ROOT, capture_output=True, text=True)
    ids = [line for line in run.stdout.splitlines() if "::" in line]
    if not ids:
        sys.exit(f"run_gpu_tests: pytest collected no GPU tests:\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
    return ids


def shards(ids: list[str], jobs: int, split: int) -> list[list[str]]:
    """ids grouped by file, files of more than `split` tests cut into parts of about `split`, the
    parts dealt largest first to the shard with the fewest tests so far."""
    by_file = defaultdict(list)
    for i in ids:
        by_file[i.split("::", 1)[0]].append(i)
    parts = []
    for tests in by_file.values():
        n = -(-len(tests) // split)
        parts += [tests[k::n] for k in range(n)]            # interleaved: each part gets every case kind
    out: list[list[str]] = [[] for _ in range(min(jobs, len(parts)))]
    for part in sorted(parts, key=len, reverse=True):
        min(out, key=len).extend(part)
    return out


SUMMARY = re.compile(r"^=*\s*(\d+ (passed|failed|error|errors|skipped|deselected)\b.*) in [\d.]+s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the shards' logs and the summary")
    ap.add_argument("--jobs", type=int, default=8, help="pytest processes at once")
    ap.add_argument("--split", type=int, default=160, help="tests of a file's part at most (about)")
    ap.add_argument("--limit", type=float, default=540, help="seconds a shard may run")
    args, extra = ap.parse_known_args(argv)
    if args.jobs < 1 or args.split < 1:
        ap.error(f"--jobs and --split must be at least 1, got {args.jobs} and {args.split}")
    args.out.mkdir(parents=True, exist_ok=True)
    plan = shards(collect(extra), args.jobs, args.split)
    start = time.monotonic()
    procs = []
    for n, ids in enumerate(plan):
        (args.out / f"shard_{n}.ids").write_text("\n".join(ids) + "\n")
        log = open(args.out / f"shard_{n}.log", "w")
        procs.append((n, ids, log, subprocess.Popen(PYTEST + ["-rfE"] + ids, cwd=ROOT, stdout=log,
                                                     stderr=subprocess.STDOUT)))
    lines, bad = [], False
    for n, ids, log, p in procs:
        try:
            rc = p.wait(timeout=max(1.0, args.limit - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rc = None
        log.close()
        text = (args.out / f"shard_{n}.log").read_text(errors="replace").splitlines()
        counts = next((m.group(1) for m in map(SUMMARY.match, reversed(text)) if m), "no summary")
        state = "timed out" if rc is None else f"exit {rc}"
        files = sorted({i.split("::", 1)[0].removeprefix("tests/") for i in ids})
        lines.append(f"shard {n}: {len(ids)} tests of {', '.join(files)}: {counts} ({state})")
        lines += [f"  {t}" for t in text if t.startswith(("FAILED ", "ERROR "))]
        bad |= rc != 0
    lines.append(f"{sum(len(ids) for ids in plan)} tests in {len(plan)} shards, {time.monotonic() - start:.0f} s")
    summary = "\n".join(lines) + "\n"
    (args.out / "summary.txt").write_text(summary)
    print(summary, end="")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
