"""bench/run_gpu_tests.py's sharding of the GPU tests into parallel pytest processes (CPU)."""

import importlib.util
from pathlib import Path

_TOOL = Path(__file__).resolve().parents[1] / "bench" / "run_gpu_tests.py"
_spec = importlib.util.spec_from_file_location("run_gpu_tests", _TOOL)
run_gpu_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_gpu_tests)


def ids(file: str, n: int) -> list[str]:
    return [f"tests/{file}::test_case[{i}]" for i in range(n)]


def test_every_test_runs_once_and_files_stay_whole_below_the_split():
    tests = ids("test_a.py", 500) + ids("test_b.py", 90) + ids("test_c.py", 40) + ids("test_d.py", 7)
    plan = run_gpu_tests.shards(tests, jobs=4, split=160)
    assert len(plan) == 4
    assert sorted(i for shard in plan for i in shard) == sorted(tests)
    for f in ("test_b.py", "test_c.py", "test_d.py"):         # smaller than a part: one shard each
        assert sum(any(f in i for i in shard) for shard in plan) == 1
    assert [sum("test_a.py" in i for i in shard) for shard in plan] == [125] * 4   # 500 in four parts, one a shard
    assert max(map(len, plan)) - min(map(len, plan)) <= 125     # largest first, to the emptiest shard


def test_fewer_parts_than_jobs_make_fewer_shards():
    plan = run_gpu_tests.shards(ids("test_a.py", 10), jobs=8, split=160)
    assert plan == [ids("test_a.py", 10)]


def test_a_summary_line_is_found_in_pytest_output():
    lines = ["....", "FAILED tests/test_a.py::test_x - AssertionError", "===== 1 failed, 41 passed, 3 skipped in 12.50s ====="]
    found = [m.group(1) for m in map(run_gpu_tests.SUMMARY.match, reversed(lines)) if m]
    assert found == ["1 failed, 41 passed, 3 skipped"]
    assert run_gpu_tests.SUMMARY.match("41 passed in 3.02s").group(1) == "41 passed"
