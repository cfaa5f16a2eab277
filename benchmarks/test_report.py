"""Tests of the suite's driver and report on made-up results (no timing involved):
    python3 -m unittest discover -s benchmarks -p 'test_*.py'
"""

import os
import tempfile
import unittest
import xml.etree.ElementTree as ElementTree

import report
import run_suite


def results_with(sides, peers_installed=True):
    """A results.json for one gemm workload with the given {side: median ns}."""
    status = {"status": "installed", "version": "1.0"} if peers_installed else {"status": "not installed", "why": "x"}
    return {
        "date": "2026-01-01 00:00 UTC", "command": "run_suite.py", "rounds": 3, "min_time_s": 0.1, "devices": ["cpu"],
        "quick": False, "seconds": 1, "libtorch_built": "libtorch" in sides, "problems": [],
        "machine": {"cpu": "Test CPU", "cpus": "2", "threads_per_core": "1", "caches": "", "flags_avx512": False,
                    "kernel": "6", "compiler": "g++", "commit": "abc"},
        "peers": {name: dict(status) for name in ("pytorch", "jax", "mindspore")},
        "workloads": {"gemm/matmul_64": {
            "suite": "gemm", "what": "f32[64, 64] @ f32[64, 64]", "threads": 1,
            "sides": {side: {"median_ns": ns, "min_ns": ns * 0.9, "max_ns": ns * 1.1, "rounds": 3, "allocs": 2.0,
                             "buffers": 1.0, "peak_MiB": 0.5} if ns else {"unsupported": "no"}
                      for side, ns in sides.items()}}},
    }


class ReportTest(unittest.TestCase):
    def test_roofline_reads_each_row_against_the_measured_limits(self):
        results = results_with({"xgrad:eager": 2000.0, "xgrad:jit_O2": 1000.0})  # matmul_64: 2 * 64^3 FLOPs
        hand = {"median_ns": 1e6, "min_ns": 1e6, "max_ns": 1e6, "rounds": 3}
        for key in ("roofline/fma_peak", "roofline/triad_2p24"):
            results["workloads"][key] = {"suite": "roofline", "what": "", "threads": 1, "sides": {"ref:hand": hand}}
        # Peak 2^25 FLOPs per ms = 33.6 GFLOP/s; the matmul's 524,288 FLOPs per us = 524 GFLOP/s.
        text = report.markdown(results, "bench")
        self.assertIn("1 thread: 33.6 GFLOP/s, 201.3 GB/s", text)
        self.assertIn("| `gemm/matmul_64` | 1 | 0.524 MFLOP | xgrad jit O2 1 µs | 524.3 GFLOP/s | 1562% of peak FLOP/s |",
                      text)
        self.assertIn("<svg", report.roofline_chart(results))
        self.assertNotIn("roofline/fma_peak` |", text.split("## Roofline")[0])  # not in the peers' table

    def test_a_limit_is_its_rows_fastest_round(self):
        results = results_with({"xgrad:jit_O2": 1000.0})
        # The peak's median twice its fastest round (both threads' chains on one core in most rounds).
        hand = {"median_ns": 2e6, "min_ns": 1e6, "max_ns": 2e6, "rounds": 3}
        results["workloads"]["roofline/fma_peak"] = {"suite": "roofline", "what": "", "threads": 1,
                                                    "sides": {"ref:hand": hand}}
        self.assertAlmostEqual(report.measured_limits(results)[1][0], 2 ** 25 / 1e-3)
        self.assertIn("1 thread: 33.6 GFLOP/s", report.markdown(results, "bench"))

    def test_flags_a_jit_level_slower_than_a_lower_one_beyond_noise(self):
        results = results_with({"xgrad:jit_O0": 1000.0, "xgrad:jit_O1": 1050.0, "xgrad:jit_O2": 3000.0})
        self.assertEqual([(s, low, round(r, 2)) for _, s, low, r in report.level_regressions(results)],
                         [("xgrad:jit_O2", "xgrad:jit_O0", 3.0), ("xgrad:jit_O2", "xgrad:jit_O1", 2.86)])
        self.assertIn("| `gemm/matmul_64` | xgrad jit O2 | xgrad jit O0 | **3.00** |", report.markdown(results, "bench"))
        # Within noise (overlapping rounds, or under the margin), and the compile suite: not flagged.
        self.assertEqual(report.level_regressions(results_with({"xgrad:jit_O0": 1000.0, "xgrad:jit_O2": 1150.0})), [])
        results["workloads"]["gemm/matmul_64"]["suite"] = "compile"
        self.assertEqual(report.level_regressions(results), [])
        self.assertEqual(report.level_regressions(results_with({"xgrad:jit_O0": 1000.0, "xgrad:jit_O2": 900.0}), 2),
                         [])

    def test_a_flagged_row_fails_only_when_measured_again_it_is_still_slower(self):
        results = results_with({"xgrad:jit_O0": 1000.0, "xgrad:jit_O1": 1000.0, "xgrad:jit_O2": 3000.0})
        flagged = report.level_regressions(results, 2)
        measured = []

        def measure_as(times):
            def measure(suite, device):
                measured.append((suite, device))
                return {("gemm/matmul_64", side): [{"ns": ns}, {"ns": ns * 1.01}, {"ns": ns * 0.99}]
                        for side, ns in times.items()}
            return measure

        # One slow moment: level again when measured longer, so nothing fails.
        self.assertEqual(run_suite.confirm_level_regressions(
            flagged, measure_as({"xgrad:jit_O0": 1000.0, "xgrad:jit_O1": 1000.0, "xgrad:jit_O2": 1010.0}), 2), [])
        self.assertEqual(measured, [("gemm", "cpu")])
        # Still 3x slower: the row fails, with the new ratio.
        still = run_suite.confirm_level_regressions(
            flagged, measure_as({"xgrad:jit_O0": 1000.0, "xgrad:jit_O1": 1000.0, "xgrad:jit_O2": 2500.0}), 2)
        self.assertEqual([(side, low, round(r, 2)) for _, side, low, r in still],
                         [("xgrad:jit_O2", "xgrad:jit_O0", 2.5), ("xgrad:jit_O2", "xgrad:jit_O1", 2.5)])
        # A row slower only in the new measurement was not flagged by the run: it does not fail it.
        self.assertEqual(run_suite.confirm_level_regressions(
            [], measure_as({"xgrad:jit_O0": 1000.0, "xgrad:jit_O2": 5000.0}), 2), [])

    def test_says_plainly_when_xgrad_is_behind(self):
        text = report.markdown(results_with({"xgrad:eager": 2000.0, "xgrad:jit_O2": 3000.0, "jax:jit": 1000.0}), "bench")
        self.assertIn("**behind JAX jit: 2.00x slower**", text)
        self.assertIn("| `gemm/matmul_64` | xgrad eager 2 µs | JAX jit 1 µs | 2.00 |", text)

    def test_behind_by_less_than_a_percent_gives_the_percentage(self):
        text = report.markdown(results_with({"xgrad:eager": 1003.0, "libtorch": 1000.0}), "bench")
        self.assertIn("**behind LibTorch by 0.3%**", text)

    def test_ahead_against_the_fastest_peer(self):
        sides = {"xgrad:jit_O2": 500.0, "pytorch:eager": 4000.0, "pytorch:compile": 1000.0, "libtorch": 2000.0}
        text = report.markdown(results_with(sides), "bench")
        self.assertIn("ahead: 2.00x faster than torch.compile", text)
        self.assertNotIn("behind", text)

    def test_peers_not_installed_are_shown(self):
        text = report.markdown(results_with({"xgrad:eager": 1000.0}, peers_installed=False), "bench")
        self.assertIn("no peer measured", text)
        row = next(line for line in text.splitlines() if line.startswith("| `matmul_64`"))
        self.assertEqual(row.count("not installed"), 7)  # LibTorch and the six Python peer modes
        self.assertEqual(row.count("not built"), 2)  # the Thrust device's eager and jit O2

    def test_data_parallel_compares_its_two_launches_only(self):
        results = results_with({"xgrad:eager": 1000.0})
        entry = {"suite": "data_parallel", "what": "LeNet5", "threads": 2, "sides": {
            "xgrad:dp_1x2": {"median_ns": 600e3, "min_ns": 590e3, "max_ns": 610e3, "rounds": 3, "comm_share": 0.0},
            "xgrad:dp_2x1": {"median_ns": 690e3, "min_ns": 680e3, "max_ns": 700e3, "rounds": 3, "comm_share": 0.13}}}
        results["workloads"]["data_parallel/lenet5_b32"] = entry
        text = report.markdown(results, "bench")
        self.assertIn("| workload | xgrad 1 process x 2 threads | xgrad 2 processes x 1 thread |", text)
        self.assertIn("| `lenet5_b32` | 1.15 | 0% | 13% |", text)
        self.assertNotIn("`data_parallel/lenet5_b32` |", text)  # no peer to be ahead of or behind
        root = ElementTree.fromstring(report.chart(results, "data_parallel"))
        titles = [e.text for e in root.iter("{http://www.w3.org/2000/svg}title")]
        self.assertEqual(len(titles), 2)

    def test_targets_are_met_or_missed_and_a_peer_reference_is_no_peer(self):
        results = results_with({"xgrad:eager": 1000.0})
        times = {"xgrad:eager": 2e6, "ref:loop": 30e6, "pytorch:eager": 1e6, "pytorch:loop": 0.5e6}
        results["workloads"]["transforms/per_example_grads_mlp_b64"] = {
            "suite": "transforms", "what": "per-example gradients", "threads": 1, "references": ["loop"],
            "sides": {side: {"median_ns": ns, "min_ns": ns, "max_ns": ns, "rounds": 3} for side, ns in times.items()}}
        text = report.markdown(results, "bench")
        self.assertIn("| vmap(grad) at least 10x faster than a loop of grad | xgrad eager 2 ms / xgrad loop of grad "
                      "30 ms = 0.07 | at most 0.1 | met |", text)
        self.assertIn("| vmap(grad) not slower than torch.func.vmap | xgrad eager 2 ms / PyTorch eager 1 ms = 2.00 | "
                      "at most 1 | **missed** |", text)
        self.assertIn("**behind PyTorch eager: 2.00x slower**", text)  # not behind the loop: a reference
        gemm_header = next(line for line in text.splitlines() if line.startswith("| workload | xgrad eager"))
        self.assertNotIn("loop", gemm_header)  # the references show where a workload has them only

    def test_chart_is_svg_with_a_bar_per_measured_side(self):
        sides = {"xgrad:eager": 1000.0, "xgrad:jit_O2": 800.0, "jax:jit": 400.0, "jax:eager": 0}
        svg = report.chart(results_with(sides), "gemm")
        root = ElementTree.fromstring(svg)
        bars = [e for e in root.iter("{http://www.w3.org/2000/svg}rect") if e.find(
            "{http://www.w3.org/2000/svg}title") is not None]
        self.assertEqual(len(bars), 3)
        self.assertIn("0.5x", svg)  # JAX jit at half xgrad's fastest time

    def test_write_replaces_files_whole(self):
        with tempfile.TemporaryDirectory() as directory:
            written = report.write(results_with({"xgrad:eager": 1000.0}), directory)
            self.assertEqual(sorted(os.path.basename(p) for p in written), ["BENCHMARKS.md", "gemm.svg"])
            self.assertFalse([name for root, _, files in os.walk(directory) for name in files if name.endswith(".tmp")])


class SummaryTest(unittest.TestCase):
    def test_median_min_max_and_largest_peak(self):
        samples = [{"ns": 4.0, "peak_MiB": 1.0, "allocs": 3.0}, {"ns": 1.0, "peak_MiB": 5.0, "allocs": 1.0},
                   {"ns": 2.0, "peak_MiB": 2.0, "allocs": 2.0}, {"ns": 10.0, "peak_MiB": 0.5, "allocs": 9.0}]
        summary = run_suite.summarize(samples)
        self.assertEqual((summary["median_ns"], summary["min_ns"], summary["max_ns"]), (3.0, 1.0, 10.0))
        self.assertEqual(summary["peak_MiB"], 5.0)
        self.assertEqual(summary["allocs"], 2.5)

    def test_no_times_no_summary(self):
        self.assertIsNone(run_suite.summarize([{"unsupported": "no"}]))


if __name__ == "__main__":
    unittest.main()
