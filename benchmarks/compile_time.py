#!/usr/bin/env python3
"""The compile-time benchmark: CPU time and peak memory to compile a user's file with xgrad.

    python3 benchmarks/compile_time.py --build build-bench [--rounds 3] [--programs hello,...]
        [--baseline NAME=INCLUDE_DIR] [--out DIR] [--docs DIR]

Compiles each program of benchmarks/compile_time/ (and one test file) with exactly the command
CMake uses for it (the build's compile_commands.json; benchmarks/CMakeLists.txt makes one object
target per program and mode), once per side and round, the sides alternating:

  header_only  against the INTERFACE target xgrad::xgrad
  compiled     against xgrad::compiled (when the build has it)
  libtorch     the LibTorch peer of the hello program, <torch/torch.h> (when CMake found Torch)
  NAME         with --baseline: header_only with xgrad's include directory swapped for
               INCLUDE_DIR (an older checkout's include/), to compare with an earlier version

Each compile is timed by the kernel: user + system CPU time and the peak resident memory of the
compiler and its subprocesses (os.wait4), the output going to a scratch file. Figures are medians
over the rounds, with min and max. Writes DIR/compile_time.json; with --docs, COMPILE_TIME.md and
bench/compile_time.svg there (the targets of docs/BENCHMARKS.md's issue: the compiled mode's hello
at most 0.3x LibTorch's hello, its MLP program at most 0.5x).
"""

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from report import write_atomically  # noqa: E402
from run_suite import machine_description  # noqa: E402

# name: (source relative to the repository, what it is)
PROGRAMS = {
    "hello": ("benchmarks/compile_time/hello.cpp",
              "the ten-line program: jit one function, take one gradient, print (xgrad/xgrad.hpp)"),
    "mlp_train": ("benchmarks/compile_time/mlp_train.cpp",
                  "an MLP trained by Model in graph mode, with a checkpoint callback, saved and loaded"),
    "test_file": ("tests/autograd/test_autograd.cpp", "one test file of the suite (doctest), tests/autograd"),
    "torch_hello": ("benchmarks/compile_time/torch_hello.cpp", "hello.cpp's program in LibTorch, <torch/torch.h>"),
}
SIDES = ["header_only", "compiled", "libtorch"]
TARGETS = {"hello": (0.3, "compiled"), "mlp_train": (0.5, "compiled")}  # program: (max ratio to LibTorch's hello, side)
BASELINE_TARGET = ("hello", 0.5)  # header-only hello at most this fraction of a --baseline's time


def commands(build):
    """{(program, side): argv} from the build's compile_commands.json."""
    path = os.path.join(build, "compile_commands.json")
    if not os.path.exists(path):
        raise SystemExit(f"compile_time: {path} not found; configure with -DXGRAD_BUILD_BENCHMARKS=ON "
                         "(benchmarks/CMakeLists.txt exports compile commands)")
    with open(path) as f:
        entries = json.load(f)
    found = {}
    for entry in entries:
        argv = entry.get("arguments") or shlex.split(entry["command"])
        output = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-o"), "")
        for program in PROGRAMS:
            for side in SIDES:
                if f"compile_time_{program}_{side}.dir" in output:
                    found[(program, side)] = (argv, entry["directory"])
    return found


def runnable(argv, scratch):
    """argv without a compiler launcher (ccache), writing its object into scratch."""
    argv = list(argv)
    while argv and os.path.basename(argv[0]) in ("ccache", "sccache"):
        argv = argv[1:]
    out = argv.index("-o")
    argv[out + 1] = os.path.join(scratch, "out.o")
    return argv


def measure(argv, directory):
    """(CPU seconds, peak MiB) of one compile; raises on failure."""
    process = subprocess.Popen(argv, cwd=directory, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stderr = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"compile failed ({process.returncode}): {shlex.join(argv)}\n{stderr.decode()[-2000:]}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def with_include(argv, old, new):
    """argv with the include directory `old` swapped for `new`."""
    swapped = []
    for a in argv:
        if a == old:
            swapped.append(new)
        elif a in ("-I" + old, "-isystem" + old):
            swapped.append(a[: len(a) - len(old)] + new)
        else:
            swapped.append(a)
    if swapped == list(argv):
        raise SystemExit(f"compile_time: --baseline: {old} is not in the header-only command")
    return swapped


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=os.path.join(ROOT, "build-bench"), help="a configured build with benchmarks")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--programs", default=",".join(PROGRAMS), help="comma-separated, default all")
    parser.add_argument("--baseline", action="append", default=[], metavar="NAME=INCLUDE_DIR",
                        help="also compile the header-only programs against another xgrad's include/")
    parser.add_argument("--out", help="where compile_time.json goes (default: BUILD/suite)")
    parser.add_argument("--docs", help="also write COMPILE_TIME.md and bench/compile_time.svg into this directory")
    args = parser.parse_args()
    programs = [p for p in args.programs.split(",") if p]
    unknown = [p for p in programs if p not in PROGRAMS]
    if unknown or args.rounds < 1:
        parser.error(f"--programs: one of {', '.join(PROGRAMS)}; --rounds >= 1")
    baselines = []
    for spec in args.baseline:
        name, _, include = spec.partition("=")
        if not name or not os.path.isdir(os.path.join(include, "xgrad")):
            parser.error(f"--baseline {spec}: NAME=DIR, with DIR/xgrad holding xgrad's headers")
        baselines.append((name, os.path.abspath(include)))

    found = commands(args.build)
    jobs = []  # (program, side, argv, directory)
    for program in programs:
        for side in SIDES:
            if (program, side) in found:
                argv, directory = found[(program, side)]
                jobs.append((program, side, argv, directory))
        if (program, "header_only") in found:
            argv, directory = found[(program, "header_only")]
            for name, include in baselines:
                jobs.append((program, name, with_include(argv, os.path.join(ROOT, "include"), include), directory))
    if not jobs:
        raise SystemExit("compile_time: no program to compile (is the build configured with benchmarks?)")

    started = time.time()
    samples = {}
    with tempfile.TemporaryDirectory() as scratch:
        for round_index in range(args.rounds):
            for program, side, argv, directory in jobs:
                seconds, mib = measure(runnable(argv, scratch), directory)
                samples.setdefault((program, side), []).append((seconds, mib))
                print(f"compile_time: round {round_index + 1}/{args.rounds} {program} {side}: "
                      f"{seconds:.2f} s CPU, {mib:.0f} MiB", flush=True)

    results = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "command": " ".join(sys.argv), "rounds": args.rounds, "machine": machine_description(),
               "seconds": round(time.time() - started), "programs": {}}
    for (program, side), values in samples.items():
        entry = results["programs"].setdefault(program, {"source": PROGRAMS[program][0], "what": PROGRAMS[program][1],
                                                         "sides": {}})
        entry["sides"][side] = {"cpu_s": summary([v[0] for v in values]), "peak_mib": summary([v[1] for v in values]),
                                "command": shlex.join(runnable(next(j[2] for j in jobs if j[:2] == (program, side)),
                                                               "$SCRATCH"))}
    out = args.out or os.path.join(args.build, "suite")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "compile_time.json")
    write_atomically(path, json.dumps(results, indent=1))
    print(f"compile_time: {path}")
    for line in verdicts(results):
        print("compile_time: " + line)
    if args.docs:
        for written in write_docs(results, args.docs):
            print(f"compile_time: wrote {written}")
    return 0


def torch_hello(results):
    side = results["programs"].get("torch_hello", {}).get("sides", {}).get("libtorch")
    return side["cpu_s"]["median"] if side else None


def verdicts(results):
    """One line per target: the ratio to LibTorch's hello and whether it holds."""
    lines = []
    reference = torch_hello(results)
    for program, (limit, side) in TARGETS.items():
        got = results["programs"].get(program, {}).get("sides", {}).get(side)
        if not got or reference is None:
            lines.append(f"{program} ({side}) at most {limit}x LibTorch's hello: not measured "
                         f"({'no LibTorch' if reference is None else 'no ' + side + ' build'})")
            continue
        ratio = got["cpu_s"]["median"] / reference
        lines.append(f"{program} ({side}) {got['cpu_s']['median']:.1f} s = {ratio:.2f}x LibTorch's hello "
                     f"({reference:.1f} s): target at most {limit}x, {'met' if ratio <= limit else 'MISSED'}")
    program, limit = BASELINE_TARGET
    sides = results["programs"].get(program, {}).get("sides", {})
    for name, got in sides.items():
        if name in SIDES or "header_only" not in sides:
            continue
        now, before = sides["header_only"]["cpu_s"]["median"], got["cpu_s"]["median"]
        lines.append(f"{program} (header_only) {now:.1f} s = {now / before:.2f}x {name}'s ({before:.1f} s): "
                     f"target at most {limit}x, {'met' if now / before <= limit else 'MISSED'}")
    return lines


def chart(results):
    """Horizontal bars: CPU seconds per program and side."""
    colours = {"header_only": "#7fb2e5", "compiled": "#1f5fa8", "libtorch": "#e8743b"}
    rows = []
    for program, entry in results["programs"].items():
        for side, got in entry["sides"].items():
            rows.append((f"{program} · {side}", got["cpu_s"]["median"], colours.get(side, "#9a9a9a")))
    width, left, bar = 760, 250, 22
    height = 40 + bar * len(rows)
    top = max([r[1] for r in rows] + [1.0])
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           'font-size="12">', f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="16">CPU seconds to compile (median of {results["rounds"]} rounds)</text>']
    for i, (label, seconds, colour) in enumerate(rows):
        y = 26 + i * bar
        length = (width - left - 70) * seconds / top
        out.append(f'<text x="{left - 6}" y="{y + bar - 8}" text-anchor="end">{label}</text>')
        out.append(f'<rect x="{left}" y="{y + 2}" width="{max(length, 1):.1f}" height="{bar - 4}" fill="{colour}"/>')
        out.append(f'<text x="{left + length + 4:.1f}" y="{y + bar - 8}">{seconds:.1f} s</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def markdown(results):
    lines = ["# Compile time", "",
             f"Generated {results['date']} by `{results['command']}` ({results['rounds']} rounds, "
             f"{results['seconds']} s in all) on {machine(results)}. CPU time (user + system) and peak "
             "memory of the compiler for one file, with the exact command CMake uses for it; median "
             "over the rounds with min – max. benchmarks/README.md (\"Compile time\") says how it measures.", ""]
    lines += ["## Targets", ""] + [f"- {line}" for line in verdicts(results)] + ["", "![compile time](bench/compile_time.svg)", ""]
    lines += ["| program | side | CPU time | peak memory |", "|---|---|---:|---:|"]
    for program, entry in results["programs"].items():
        for side, got in entry["sides"].items():
            t, m = got["cpu_s"], got["peak_mib"]
            lines.append(f"| `{program}` | {side} | {t['median']:.2f} s<br><sub>{t['min']:.2f} – {t['max']:.2f}</sub> "
                         f"| {m['median']:.0f} MiB |")
    lines += ["", "Programs:", ""]
    for program, entry in results["programs"].items():
        lines.append(f"- `{program}` (`{entry['source']}`): {entry['what']}")
    return "\n".join(lines) + "\n"


def machine(results):
    m = results["machine"]
    return f"{m['cpu']} ({m['cpus']} CPUs), {m['compiler']}, commit {m['commit']}"


def write_docs(results, docs):
    os.makedirs(os.path.join(docs, "bench"), exist_ok=True)
    written = [os.path.join(docs, "COMPILE_TIME.md"), os.path.join(docs, "bench", "compile_time.svg")]
    write_atomically(written[0], markdown(results))
    write_atomically(written[1], chart(results))
    return written


if __name__ == "__main__":
    sys.exit(main())
