"""bench/ncu_summary.py: an ncu CSV summed by kernel name (CPU; the rows are in ncu 2025's format)."""

import importlib.util
from pathlib import Path

_TOOL = Path(__file__).resolve().parents[1] / "bench" / "ncu_summary.py"
_spec = importlib.util.spec_from_file_location("ncu_summary", _TOOL)
ncu_summary = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ncu_summary)

HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n')


def row(i, name, unit, value):
    return (f'"{i}","1","python3.12","127.0.0.1","{name}","1","13","(128, 1, 1)","(1, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","gpu__time_duration.sum","{unit}","{value}"\n')


def test_sums_by_kernel_name_in_microseconds(tmp_path):
    csv = tmp_path / "n.csv"
    csv.write_text("==PROF== noise before the table\n" + HEAD
                   + row(0, "void gemv_dp4a_kernel<gguf::Q4_K, 1>(float *, const int *)", "ns", "3,744")
                   + row(1, "void gemv_dp4a_kernel<gguf::Q4_K, 1>(float *, const int *)", "ns", "1,256")
                   + row(2, "cupy_take", "usecond", "2.5")
                   + row(3, "quantize_x_kernel(int *, float *)", "ns", "n/a"))
    rows, total = ncu_summary.summarize(csv)
    assert rows == [("gemv_dp4a_kernel<Q4_K, 1>", 2, 5.0), ("cupy_take", 1, 2.5)]
    assert total == 7.5


def test_short_names():
    assert ncu_summary.short("void attn_kernel<128, 4>(float *, int)") == "attn_kernel<128, 4>"
