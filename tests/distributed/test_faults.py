#!/usr/bin/env python3
"""Faults in data-parallel training, each a real mpirun job of tests/distributed/faults.cpp:

    python3 tests/distributed/test_faults.py MPIEXEC FAULTS_PROGRAM

- a rank that stops answering: the other's collective times out (3 s) with a DistributedError
  naming it, and the job ends, the silent rank too, well before that rank would have;
- a rank killed mid-training (SIGKILL before step 7): the job ends promptly, naming the rank, and
  the checkpoints written before it stay loadable;
- a run resumed from the latest of them ends with the parameters of the uninterrupted run, bit
  for bit.

Exits 1 and prints each failed check with the job's output. ctest runs it (xgrad_distributed_faults).
"""

import os
import subprocess
import sys
import tempfile
import time

MPIEXEC, PROGRAM = sys.argv[1], sys.argv[2]
# Open MPI: allow root (CI) and two ranks on fewer cores.
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")
failures = []


def run(*args):
    """(exit status, output, seconds) of `mpiexec -n 2 PROGRAM args`."""
    start = time.monotonic()
    job = subprocess.run([MPIEXEC, "-n", "2", PROGRAM, *args], env=ENV, capture_output=True, text=True, timeout=120)
    return job.returncode, job.stdout + job.stderr, time.monotonic() - start


def check(ok, what, output):
    if not ok:
        failures.append(f"{what}\n--- the job's output ---\n{output}")


with tempfile.TemporaryDirectory() as scratch:
    status, output, seconds = run("hang", scratch)
    check(status != 0, "hang: the job must fail", output)
    check("DistributedError" in output and "rank 1 did not reach it" in output,
          "hang: rank 0's error names rank 1", output)
    check(seconds < 60, f"hang: the job ended after {seconds:.1f} s; rank 1 sleeps 120 s, the timeout is 3 s", output)

    full, killed = os.path.join(scratch, "full"), os.path.join(scratch, "killed")
    os.mkdir(full)
    os.mkdir(killed)
    status, output, _ = run("train", full, "full")
    check(status == 0, "train: the uninterrupted run", output)

    status, output, seconds = run("train", killed, "killed", "--kill-at", "7")
    check(status != 0, "kill: the job must fail", output)
    check("rank 1" in output, "kill: the job's error names rank 1", output)
    check(seconds < 60, f"kill: the job ended after {seconds:.1f} s", output)
    check(not os.path.exists(os.path.join(killed, "final-killed.bin")), "kill: the run must not finish", output)
    saved = sorted(f for f in os.listdir(killed) if f.endswith(".ckpt"))
    check(saved and all(f.startswith("lenet5-1_") for f in saved), f"kill: checkpoints before step 7: {saved}", output)

    status, output, _ = run("train", killed, "resumed", "--resume")
    check(status == 0 and "resumed from lenet5-1_" in output, "resume: the run resumed from a checkpoint", output)
    paths = [os.path.join(full, "final-full.bin"), os.path.join(killed, "final-resumed.bin")]
    if all(os.path.exists(p) for p in paths):
        with open(paths[0], "rb") as a, open(paths[1], "rb") as b:
            check(a.read() == b.read(), "resume: the final parameters equal the uninterrupted run's, bit for bit",
                  output)
    else:
        check(False, f"resume: missing {[p for p in paths if not os.path.exists(p)]}", output)

for failure in failures:
    print(f"FAILED: {failure}\n")
print("test_faults: hang, kill and resume behave" if not failures else f"test_faults: {len(failures)} checks failed")
sys.exit(1 if failures else 0)
