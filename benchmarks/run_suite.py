#!/usr/bin/env python3
"""Runs xgrad's benchmark suite beside its peers and writes the results.

    python3 benchmarks/run_suite.py --bench build-bench/benchmarks/xgrad_bench [--quick]
        [--suites dispatch,gemm,...] [--rounds N] [--min-time S] [--peers-venv DIR]
        [--out DIR] [--docs DIR] [--devices cpu,thrust]

scripts/bench.sh builds xgrad_bench and calls this; benchmarks/README.md describes the suite.

Each round runs, suite by suite, xgrad_bench's rows of the suite (xgrad eager and jit O0/O1/O2,
the references: hand-written loops, OpenBLAS, the transforms' plain counterparts; LibTorch when it
was built), xgrad's rows again on Device::thrust when xgrad_bench has the Thrust backend, and then
every Python peer's implementations of the same workloads and the references it has for them
(benchmarks/peers/, one worker process per peer and thread count, kept for the whole run). Rounds repeat that, so every side is measured
A B C A B C ...: a machine that drifts during the run moves all sides alike. Each figure is the
median over the rounds, with the min and the max.

Writes to --out: results.json (every sample, the medians, the machine), and with --docs the
generated BENCHMARKS.md and one SVG chart per suite into that directory (report.py).
"""

import argparse
import datetime
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CPU_ONLY_SUITES = ("attention", "seq_step")
sys.path.insert(0, HERE)
import report  # noqa: E402
from workloads import PEER_IMPORT, PEER_MODES, PEER_REFERENCES, SUITES, WORKLOADS  # noqa: E402

# Peers whose worker is pinned to as many cores as the workload's threads (Peer, below).
PIN_CORES = {"jax": True, "mindspore": True}
PEER_TIMEOUT_S = 900  # one request; a first torch.compile of a train step takes tens of seconds


def log(message):
    print(message, file=sys.stderr, flush=True)


class Peer:
    """One worker process: a peer framework at one thread count (harness.py's protocol)."""

    def __init__(self, name, venvs, threads, preload, log_dir):
        self.name, self.threads = name, threads
        self.missing = None
        self.version = None
        python = os.path.abspath(os.path.join(venvs, name, "bin", "python"))  # the worker runs in log_dir
        if not os.path.exists(python):
            self.missing = f"no {python} (bash benchmarks/peers/setup_venv.sh)"
            return
        env = dict(os.environ)
        for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[variable] = str(threads)
        if preload:
            env["LD_PRELOAD"] = preload
        # JAX's and MindSpore's workers may run on `threads` cores only: XLA's thread flags do not
        # bound its CPU runtime (a 1-thread matmul_1024 ran faster than one core can compute it),
        # nor does MindSpore 2.10's threads_num its matmul (1-thread GRAPH matmul_1024: 9.4 ms on
        # two cores' time, 2 s of CPU a second; 17.2 ms pinned to one), though its runtime then
        # hands every op between threads on one core (~1.7 ms an op): its cost on one core.
        # PyTorch's and LibTorch's knobs bind, and pinning would hurt their helper threads.
        cores = sorted(os.sched_getaffinity(0))[:threads] if PIN_CORES.get(name) else sorted(os.sched_getaffinity(0))
        self.stderr = open(os.path.join(log_dir, f"{name}_t{threads}.log"), "w")
        self.process = subprocess.Popen(
            [python, os.path.join(HERE, "peers", f"{name}_peer.py"), "--threads", str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env,
            cwd=log_dir,  # where a framework's own log files (MindSpore's rank_0/) land
            preexec_fn=lambda: os.sched_setaffinity(0, cores))
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        hello = self._receive(PEER_TIMEOUT_S)
        if hello is None or "ready" not in hello:
            self.missing = (hello or {}).get("missing", "the worker did not start (see its log)")
            self.close()
        else:
            self.version = hello["version"]

    def _read(self):
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _receive(self, timeout):
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            return None
        return json.loads(line) if line else None

    def run(self, key, mode, min_time):
        if self.missing:
            return {"missing": self.missing}
        self.process.stdin.write(json.dumps({"key": key, "mode": mode, "min_time": min_time}) + "\n")
        self.process.stdin.flush()
        answer = self._receive(PEER_TIMEOUT_S)
        if answer is None:
            self.missing = f"the worker stopped or hung on {key} ({mode}); see its log"
            self.close()
            return {"error": self.missing}
        return answer

    def close(self):
        if getattr(self, "process", None) and self.process.poll() is None:
            self.process.kill()


# Open MPI's permissions for the data_parallel suite's mpirun: as root (CI), more ranks than cores.
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def bench_has_mpi(bench):
    """True when xgrad_bench was built with MPI (`--has-mpi` says yes) and mpiexec is installed."""
    probe = subprocess.run([bench, "--has-mpi"], capture_output=True, text=True)
    return probe.stdout.strip() == "yes" and shutil.which("mpiexec") is not None


def run_xgrad_bench(bench, suite, min_time, device, out_dir, processes=None):
    """One pass over a suite's rows in xgrad_bench on a device (on thrust only xgrad's own rows):
    ({(key, side): answer}, [problems]). The data_parallel suite runs alone (its side "dp_1x2")
    or, with `processes`, under mpirun (side "dp_<processes>x1")."""
    launch = f"_mpi{processes}" if processes else ""
    out = os.path.join(out_dir, f"xgrad_{suite}_{device}{launch}.json")
    rows = f"^{suite}/" if device == "cpu" else f"^{suite}/[^/]+/(eager|jit_)"
    command = [bench, f"--benchmark_filter={rows}", f"--benchmark_min_time={min_time}",
               f"--benchmark_out={out}", "--benchmark_out_format=json", f"--device={device}"]
    env = None
    if processes:
        command = ["mpiexec", "-n", str(processes)] + command
        env = dict(os.environ, **MPI_ENV)
    result = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    if result.returncode != 0 or not os.path.exists(out):
        return {}, [f"xgrad_bench failed on suite {suite} (exit {result.returncode}): {result.stderr[-2000:]}"]
    if os.path.getsize(out) == 0:  # no row of the suite on this device (the roofline's run on the cpu alone)
        return {}, []
    with open(out) as file:
        data = json.load(file)
    scale = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
    answers, problems = {}, []
    for row in data["benchmarks"]:
        parts = row["name"].split("/")
        key, impl = "/".join(parts[:2]), parts[2]
        side = report.side_of(impl, device)
        if suite == "data_parallel":
            side = f"xgrad:dp_{processes}x1" if processes else "xgrad:dp_1x2"
        if row.get("error_occurred"):
            answers[(key, side)] = {"error": row.get("error_message", "error")}
            problems.append(f"{key}/{impl} on {device}: {row.get('error_message', 'error')}")
            continue
        answers[(key, side)] = {
            "ns": row["real_time"] * scale[row["time_unit"]],
            "iterations": row["iterations"],
            "allocs": row.get("allocs/call"),
            "buffers": row.get("buffers/call"),
            "peak_MiB": row.get("peak_MiB"),
            "comm_share": row.get("comm_share"),
        }
    return answers, problems


def build_heap_counter(out_dir):
    """benchmarks/heap_count.cpp as a shared library for LD_PRELOAD, or None."""
    library = os.path.abspath(os.path.join(out_dir, "libheap_count.so"))  # the workers run in out_dir
    compiler = os.environ.get("CXX", "c++")
    result = subprocess.run([compiler, "-O2", "-shared", "-fPIC", os.path.join(HERE, "heap_count.cpp"), "-o", library],
                            capture_output=True, text=True)
    if result.returncode != 0:
        log(f"run_suite: could not build heap_count.cpp ({result.stderr.strip()}); peers report no allocations")
        return None
    return library


def machine_description():
    def command_output(command):
        try:
            return subprocess.run(command, capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return ""

    fields = {}
    for line in command_output(["lscpu"]).splitlines():
        name, _, value = line.partition(":")
        fields[name.strip()] = value.strip()
    compiler = command_output([os.environ.get("CXX", "c++"), "--version"]).splitlines()
    commit = command_output(["git", "-C", HERE, "rev-parse", "--short", "HEAD"]).strip()
    dirty = command_output(["git", "-C", HERE, "status", "--porcelain", "--untracked-files=no"]).strip()
    return {
        "cpu": fields.get("Model name", "unknown"),
        "cpus": fields.get("CPU(s)", "?"),
        "threads_per_core": fields.get("Thread(s) per core", "?"),
        "caches": ", ".join(f"{k} {fields[k]}" for k in ("L1d cache", "L2 cache", "L3 cache") if k in fields),
        "flags_avx512": "avx512f" in fields.get("Flags", ""),
        "kernel": os.uname().release,
        "compiler": compiler[0] if compiler else "unknown",
        "commit": commit + ("+changes" if dirty else ""),
    }


def summarize(samples):
    """Median, min and max of the times; the allocation and buffer counts' medians; the peak's max."""
    times = sorted(s["ns"] for s in samples if "ns" in s)
    if not times:
        return None

    def median(values):
        values = sorted(values)
        middle = len(values) // 2
        return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2

    def counter(name, pick):
        values = [s[name] for s in samples if s.get(name) is not None]
        return pick(values) if values else None

    return {"median_ns": median(times), "min_ns": times[0], "max_ns": times[-1], "rounds": len(times),
            "allocs": counter("allocs", median), "buffers": counter("buffers", median),
            "peak_MiB": counter("peak_MiB", max), "comm_share": counter("comm_share", median)}


# A row --fail-on-level-regression flags is measured again, this many rounds of this many times
# the run's time per measurement, before it fails the run: a quick run times a row of nanoseconds
# for a millisecond, and one slow moment of the machine there flagged dispatch rows at 2-3x.
CONFIRM_ROUNDS = 3
CONFIRM_TIME_FACTOR = 10


def confirm_level_regressions(flagged, measure, margin):
    """The rows of `flagged` (report.level_regressions) that are flagged again when their suites
    are measured once more: `measure(suite, device)` returns {(key, side): [answer per round]}.
    [(workload, side, lower side, time ratio)] from the new measurements, worst first."""
    again = {"workloads": {}}
    for suite, device in sorted({(key.split("/")[0], "thrust" if side.startswith("xgrad-thrust:") else "cpu")
                                 for key, side, _, _ in flagged}):
        for (key, side), answers in measure(suite, device).items():
            summary = summarize(answers)
            if summary:
                again["workloads"].setdefault(key, {"suite": suite, "sides": {}})["sides"][side] = summary
    wanted = {(key, side, lower) for key, side, lower, _ in flagged}
    return [row for row in report.level_regressions(again, margin) if row[:3] in wanted]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", required=True, help="the xgrad_bench executable")
    parser.add_argument("--quick", action="store_true",
                        help="a first look: 3 short rounds, no Python peers unless --peers")
    parser.add_argument("--peers", action="store_true", help="run the Python peers in --quick mode too")
    parser.add_argument("--suites", default=",".join(SUITES), help="comma-separated suites (default: all)")
    parser.add_argument("--rounds", type=int, help="rounds (default 5; 3 with --quick)")
    parser.add_argument("--min-time", type=float, help="seconds per measurement (default 0.05; 0.01 with --quick)")
    parser.add_argument("--peers-venv", default=os.path.join(HERE, "..", "build-bench", "peers-venv"),
                        help="the peers' virtual environments, DIR/<peer> (peers/setup_venv.sh makes them)")
    parser.add_argument("--out", default="build-bench/suite", help="where results.json and logs go")
    parser.add_argument("--docs", help="also write BENCHMARKS.md and the SVG charts into this directory")
    parser.add_argument("--devices", help="comma-separated devices for xgrad's rows, cpu and/or thrust "
                        "(default: both when xgrad_bench has the Thrust backend, else cpu)")
    parser.add_argument("--fail-on-level-regression", type=float, metavar="RATIO",
                        help="fail when a jit level takes more than RATIO times a lower level's time on a row "
                        "(the tests' quick run: a wide margin against noise)")
    args = parser.parse_args()

    suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    unknown = [s for s in suites if s not in SUITES]
    if unknown:
        parser.error(f"--suites: unknown suite(s) {', '.join(unknown)}; the suites are {', '.join(SUITES)}")
    rounds = args.rounds or (3 if args.quick else 5)
    min_time = args.min_time or (0.01 if args.quick else 0.05)
    if rounds < 1 or min_time <= 0:
        parser.error("--rounds must be >= 1 and --min-time > 0")
    if not os.access(args.bench, os.X_OK):
        parser.error(f"--bench: {args.bench} is not an executable (build it first: scripts/bench.sh does)")
    os.makedirs(args.out, exist_ok=True)
    use_peers = not args.quick or args.peers
    started = time.time()

    listed = subprocess.run([args.bench, "--benchmark_list_tests"], capture_output=True, text=True).stdout.split()
    has_thrust = subprocess.run([args.bench, "--device=thrust", "--benchmark_list_tests"],
                                capture_output=True).returncode == 0
    devices = args.devices.split(",") if args.devices else ["cpu", "thrust"] if has_thrust else ["cpu"]
    if any(d not in ("cpu", "thrust") for d in devices) or ("thrust" in devices and not has_thrust):
        parser.error(f"--devices: cpu and/or thrust (thrust needs a build with XGRAD_THRUST_SYSTEM), got {args.devices}")
    libtorch_built = any(name.split("/")[2:3] == ["libtorch"] for name in listed)
    preload = build_heap_counter(args.out) if use_peers else None
    peers = {}
    workloads = [w for w in WORKLOADS if w.suite in suites]
    has_mpi = "data_parallel" in suites and bench_has_mpi(args.bench)
    for name in PEER_MODES:
        for threads in sorted({w.threads for w in workloads if w.peers}):
            if not use_peers:
                peers[(name, threads)] = None
                continue
            log(f"run_suite: starting {name} ({threads} thread{'s' if threads > 1 else ''})")
            peers[(name, threads)] = Peer(name, args.peers_venv, threads, preload, args.out)

    samples = {}  # (key, side) -> [answer per round]
    problems = []
    for round_index in range(rounds):
        for suite in suites:
            log(f"run_suite: round {round_index + 1}/{rounds}, {suite}")
            # data_parallel: alone on the cpu, then as 2 processes under mpirun (when built with MPI).
            # The sequence-model suites on the cpu only: Thrust's host systems run attention a
            # query row per call, seconds per train step, which says nothing about a GPU.
            if suite == "data_parallel":
                launches = [("cpu", None)] + ([("cpu", 2)] if has_mpi else [])
            elif suite in CPU_ONLY_SUITES:
                launches = [("cpu", None)] if "cpu" in devices else []
            else:
                launches = [(d, None) for d in devices]
            for device, processes in launches:
                answers, found = run_xgrad_bench(args.bench, suite, min_time, device, args.out, processes)
                problems += [p for p in found if p not in problems]
                for key_side, answer in answers.items():
                    samples.setdefault(key_side, []).append(answer)
            if suite == "data_parallel" and not has_mpi:
                for workload in (w for w in workloads if w.suite == suite):
                    samples.setdefault((workload.key, "xgrad:dp_2x1"), []).append(
                        {"missing": "xgrad_bench without MPI (-DXGRAD_MPI=ON) or no mpiexec"})
            for workload in (w for w in workloads if w.suite == suite and w.peers):
                for name, modes in PEER_MODES.items():
                    peer = peers[(name, workload.threads)]
                    if peer is None:
                        continue
                    references = [r for r in PEER_REFERENCES.get(name, []) if r in workload.references]
                    for mode in modes + references:
                        answer = peer.run(workload.key, mode, min_time)
                        samples.setdefault((workload.key, f"{name}:{mode}"), []).append(answer)
    for peer in peers.values():
        if peer:
            peer.close()

    results = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "command": " ".join(sys.argv), "rounds": rounds, "min_time_s": min_time, "devices": devices,
               "quick": args.quick, "seconds": round(time.time() - started), "machine": machine_description(),
               "libtorch_built": libtorch_built, "peers": {}, "workloads": {}, "problems": problems}
    for name in PEER_MODES:
        states = [p for (n, _), p in peers.items() if n == name]
        if not use_peers:
            status = {"status": "not run (--quick)"}
        elif any(p and p.version for p in states):
            status = {"status": "installed", "version": next(p.version for p in states if p and p.version)}
        else:
            status = {"status": "not installed",
                      "why": next((p.missing for p in states if p and p.missing), f"{PEER_IMPORT[name]} not importable")}
        results["peers"][name] = status
    for workload in workloads:
        entry = {"suite": workload.suite, "what": workload.what, "threads": workload.threads,
                 "references": list(workload.references), "sides": {}}
        for (key, side), answers in samples.items():
            if key != workload.key:
                continue
            summary = summarize(answers)
            if summary:
                entry["sides"][side] = summary
                continue
            first = answers[0]
            why = first.get("unsupported") or first.get("missing") or first.get("error") or "no result"
            kind = "unsupported" if "unsupported" in first else "missing" if "missing" in first else "error"
            entry["sides"][side] = {kind: why.strip().splitlines()[-1]}
        results["workloads"][workload.key] = entry
    path = os.path.join(args.out, "results.json")
    with open(path, "w") as file:
        json.dump(results, file, indent=1)
    log(f"run_suite: {path} ({results['seconds']} s)")
    for problem in problems:
        log(f"run_suite: {problem}")
    if args.docs:
        written = report.write(results, args.docs)
        log("run_suite: wrote " + ", ".join(written))
    if args.fail_on_level_regression:
        flagged = report.level_regressions(results, args.fail_on_level_regression)
        if flagged:
            log("run_suite: measuring again, longer, the rows a higher jit level was slower on: " +
                ", ".join(sorted({key for key, _, _, _ in flagged})))

            def measure(suite, device):
                samples = {}
                for _ in range(CONFIRM_ROUNDS):
                    answers, _ = run_xgrad_bench(args.bench, suite, min_time * CONFIRM_TIME_FACTOR, device, args.out)
                    for key_side, answer in answers.items():
                        samples.setdefault(key_side, []).append(answer)
                return samples

            flagged = confirm_level_regressions(flagged, measure, args.fail_on_level_regression)
        for key, side, lower, ratio in flagged:
            problems.append(f"{key}: {side} takes {ratio:.2f}x the time of {lower} (a higher jit level must not be "
                            f"slower; --fail-on-level-regression {args.fail_on_level_regression:g})")
            log(f"run_suite: {problems[-1]}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
