"""bench/backward_kernels.py's table of an Nsight Compute run (no GPU needed): each marked backward's kernels."""

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "backward_kernels.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("backward_kernels", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ncu_csv(rows):
    """ncu --csv --page raw: a log line, the header, the units, then a row a kernel."""
    lines = ['==PROF== Connected to process 7', '"ID","Kernel Name","gpu__time_duration.sum",'
             '"dram__throughput.avg.pct_of_peak_sustained_elapsed"', '"","","nsecond","%"']
    lines += [f'"{i}","{name}","{us}","{pct}"' for i, (name, us, pct) in enumerate(rows)]
    return "\n".join(lines) + "\n"


MARK = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<short>, std::array<char *, 1>>(int)"


def test_each_marked_call_gets_its_kernels(tmp_path):
    bench = load_bench()
    (tmp_path / "r.csv").write_text(ncu_csv([
        (MARK, "1900", "0.1"),
        ("void flash_attention::backward_preprocess_kernel<1, 64, 64>(flash_attention::BackwardArgs)", "91700", "88"),
        ("void flash_attention::sm90::backward_dq_kernel<5248, 5411>(flash_attention::BackwardArgs)", "1,065,500", "82"),
        (MARK, "1800", "0.1"),
        ("kernel_cutlass_kernel_flash_attncuteflash_bwd_postprocess", "63000", "86"),
    ]))
    (tmp_path / "labels.txt").write_text("ours | 64 | no | 1024\nFA4 | 64 | no | 1024\n")
    lines = bench.ncu_table(tmp_path / "r.csv", tmp_path / "labels.txt")
    assert lines[2] == ("| ours | 64 | no | 1024 | 1157.2 | flash_attention::backward_preprocess_kernel: 91.7 (88%), "
                        "flash_attention::sm90::backward_dq_kernel: 1065.5 (82%) |")
    assert lines[3] == "| FA4 | 64 | no | 1024 | 63.0 | kernel_cutlass_kernel_flash_attncuteflash_bwd_postprocess: 63.0 (86%) |"


def test_a_count_that_differs_from_the_labels_is_refused(tmp_path):
    bench = load_bench()
    (tmp_path / "r.csv").write_text(ncu_csv([(MARK, "1900", "0.1"), ("k", "5000", "1")]))
    (tmp_path / "labels.txt").write_text("ours | 64 | no | 1024\nFA4 | 64 | no | 1024\n")
    with pytest.raises(SystemExit, match="expected 2 marked backward calls .* got 1"):
        bench.ncu_table(tmp_path / "r.csv", tmp_path / "labels.txt")


def test_a_report_without_kernels_or_in_other_units_is_refused(tmp_path):
    bench = load_bench()
    (tmp_path / "labels.txt").write_text("ours | 64 | no | 1024\n")
    (tmp_path / "empty.csv").write_text("==PROF== No kernels were profiled.\n")
    with pytest.raises(SystemExit, match="got 0 CSV rows"):
        bench.ncu_table(tmp_path / "empty.csv", tmp_path / "labels.txt")
    (tmp_path / "cycles.csv").write_text(ncu_csv([(MARK, "1900", "0.1")]).replace("nsecond", "cycle"))
    with pytest.raises(SystemExit, match="got 'cycle'"):
        bench.ncu_table(tmp_path / "cycles.csv", tmp_path / "labels.txt")
