"""Tests of compile_time.py's pieces that need no compiler: python3 -m unittest discover -s benchmarks -p 'test_*.py'."""

import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compile_time  # noqa: E402


def results_with(sides):
    """A results dict holding {(program, side): cpu seconds}."""
    programs = {}
    for (program, side), seconds in sides.items():
        entry = programs.setdefault(program, {"source": "x.cpp", "what": "w", "sides": {}})
        entry["sides"][side] = {"cpu_s": {"median": seconds, "min": seconds, "max": seconds},
                                "peak_mib": {"median": 100, "min": 100, "max": 100}}
    return {"programs": programs, "rounds": 1, "date": "d", "command": "c", "seconds": 1,
            "machine": {"cpu": "cpu", "cpus": "2", "compiler": "g++", "commit": "abc"}}


class CompileTime(unittest.TestCase):
    def test_commands_are_found_by_target_and_side(self):
        build = tempfile.mkdtemp()
        entries = [
            {"directory": build, "file": "hello.cpp",
             "command": "/usr/bin/ccache /usr/bin/c++ -I/src/include -O2 -o "
                        "CMakeFiles/compile_time_hello_header_only.dir/hello.cpp.o -c hello.cpp"},
            {"directory": build, "file": "torch_hello.cpp",
             "command": "/usr/bin/c++ -o CMakeFiles/compile_time_torch_hello_libtorch.dir/t.cpp.o -c t.cpp"},
            {"directory": build, "file": "other.cpp", "command": "/usr/bin/c++ -o CMakeFiles/other.dir/o.o -c o.cpp"},
        ]
        with open(os.path.join(build, "compile_commands.json"), "w") as f:
            json.dump(entries, f)
        found = compile_time.commands(build)
        self.assertEqual(sorted(found), [("hello", "header_only"), ("torch_hello", "libtorch")])
        argv = compile_time.runnable(found[("hello", "header_only")][0], "/scratch")
        self.assertEqual(argv[0], "/usr/bin/c++")  # the launcher is dropped: ccache would time a cache hit
        self.assertEqual(argv[argv.index("-o") + 1], "/scratch/out.o")

    def test_baseline_swaps_the_include_directory(self):
        argv = ["c++", "-I/src/include", "-isystem", "/usr/include", "-c", "a.cpp"]
        self.assertEqual(compile_time.with_include(argv, "/src/include", "/old/include")[1], "-I/old/include")
        with self.assertRaises(SystemExit):
            compile_time.with_include(argv, "/elsewhere", "/old/include")

    def test_verdicts_compare_with_libtorchs_hello(self):
        lines = compile_time.verdicts(results_with({("torch_hello", "libtorch"): 10.0, ("hello", "compiled"): 2.0,
                                                    ("mlp_train", "compiled"): 6.0}))
        self.assertIn("hello (compiled) 2.0 s = 0.20x LibTorch's hello (10.0 s): target at most 0.3x, met", lines)
        self.assertIn("mlp_train (compiled) 6.0 s = 0.60x LibTorch's hello (10.0 s): target at most 0.5x, MISSED",
                      lines)

    def test_verdicts_compare_header_only_with_a_baseline(self):
        lines = compile_time.verdicts(results_with({("hello", "header_only"): 20.0, ("hello", "v1"): 50.0}))
        self.assertIn("hello (header_only) 20.0 s = 0.40x v1's (50.0 s): target at most 0.5x, met", lines)

    def test_verdicts_say_what_was_not_measured(self):
        lines = compile_time.verdicts(results_with({("hello", "header_only"): 20.0}))
        self.assertEqual(len(lines), 2)
        self.assertTrue(all("not measured (no LibTorch)" in line for line in lines))

    def test_docs_hold_every_side(self):
        results = results_with({("hello", "header_only"): 20.0, ("torch_hello", "libtorch"): 10.0})
        text = compile_time.markdown(results)
        self.assertIn("| `hello` | header_only | 20.00 s", text)
        self.assertIn("| `torch_hello` | libtorch | 10.00 s", text)
        self.assertIn("hello · header_only", compile_time.chart(results))


if __name__ == "__main__":
    unittest.main()
