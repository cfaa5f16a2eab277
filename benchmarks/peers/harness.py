"""A peer worker: times one framework's implementation of the suite's workloads on request.

run_suite.py starts one worker per (peer, thread count) as
    python benchmarks/peers/<peer>_peer.py --threads N
and talks to it in JSON lines. The worker first answers {"ready": true, "version": ...} (or
{"missing": "<why>"} when its framework does not import), then for each request
    {"key": "conv/conv1_fwd", "mode": "eager", "min_time": 0.1}
answers {"ns": ns per call, "iterations": n, "allocs": heap allocations per call or null,
"peak_MiB": ...} or {"unsupported": "<why>"} or {"error": "<what happened>"}.

Timing follows Google Benchmark's: the call is repeated in batches of growing size until one
batch lasts min_time, and that batch gives the time per call (wall clock). Frameworks that
dispatch asynchronously (JAX, MindSpore) are waited for once per batch, on the last call's
result, so a batch times finished work while their pipelines may overlap dispatch with compute. A workload is prepared
(inputs made, compiled where the mode compiles) on its first request and kept for the next
rounds, so only its first measurement includes setup in the peak memory.

Counters, measured as xgrad_bench measures them (benchmarks/suite.hpp):
  allocs   calls of malloc and friends per call, from benchmarks/heap_count.cpp, which
           run_suite.py builds as a shared library and LD_PRELOADs into the worker;
  peak_MiB peak resident memory during the request above the resident memory at its start,
           after the interpreter's garbage and glibc's free memory were handed back.
"""

import argparse
import ctypes
import gc
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from workloads import (  # noqa: E402  (the table lives one directory up)
    ATTENTION, BY_KEY, CONV, TRANSFORMS_BATCH, TRANSFORMS_MLP)


class Unsupported(Exception):
    """The peer has no implementation of this workload in this mode."""


def function_and_inputs(workload, fw):
    """(f, inputs) of the workloads that are one function of tensors (all but the train steps and
    the compile suite), written once over a framework's primitives `fw`:
      fw.tensor(numpy array), fw.add, fw.exp, fw.tanh, fw.sigmoid, fw.matmul,
      fw.conv2d(x, w) (valid, stride 1), fw.softmax(x) (last axis), fw.sum(x, axis=None),
      fw.grad(f, argnums, inputs): a function of the inputs giving f's gradients with respect to
        inputs[argnums] (f returns a scalar),
      fw.recorded(x): x requiring grad, so ops on it are recorded for backward (raises
        Unsupported where the framework has no tape);
    for the transforms suite (transform_and_inputs) fw.relu, fw.sin, fw.cross_entropy(logits,
    labels) (sparse labels, mean) and the function transforms fw.grad_of(f) (f's gradient in its
    first argument), fw.vmap(f, in_axes), fw.hessian(f), fw.jvp(f, x, t) -> (f(x), J t);
    and for the attention suite fw.attention(q, k, v) (causal, scale 1 / sqrt(D)) and
    fw.heads(numpy array [B, H, T, D]): that array as the op's input, in the op's own layout.
    Inputs come from numpy's generator: the same numbers for every peer. The functions are defs,
    not lambdas, because mindspore.jit parses their source."""
    import numpy as np

    suite, name = workload.suite, workload.name

    def normal(*shape, seed=1):
        return fw.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))

    def chain7(x):
        return fw.tanh(x * 1.5 + 0.25) * fw.sigmoid(x) + x * x

    if suite == "dispatch":
        n = int(name.split("_")[-1])
        a = normal(n, seed=1)
        return fw.add, (fw.recorded(a) if name.startswith("add_grad") else a, normal(n, seed=2))
    if suite == "cache_hit":
        return chain7, (normal(1, seed=3),)
    if suite == "elementwise":
        op, size = name.split("_")
        n = int(float(size))
        f = {"add": fw.add, "exp": fw.exp, "chain7": chain7}[op]
        return f, (normal(n, seed=1), normal(n, seed=2))[: 2 if op == "add" else 1]
    if suite == "reductions":
        if name == "sum_1e7":
            return fw.sum, (normal(10_000_000),)
        if name.startswith("sum_axis"):
            axis = int(name[len("sum_axis")])

            def sum_over_axis(x):
                return fw.sum(x, axis)

            return sum_over_axis, (normal(1024, 1024),)
        return fw.softmax, (normal(256, 1000),)
    if suite == "gemm":
        n = int(name.split("_")[1])
        rng = np.random.default_rng(1)
        return fw.matmul, tuple(fw.tensor(rng.uniform(-1, 1, (n, n)).astype(np.float32)) for _ in range(2))
    if suite == "conv":
        layer, kind = name.split("_")
        x_shape, w_shape, input_grad = CONV[layer]
        inputs = (normal(*x_shape, seed=5), normal(*w_shape, seed=6))
        if kind == "fwd":
            return fw.conv2d, inputs

        def conv_sum(x, w):
            return fw.sum(fw.conv2d(x, w))

        return fw.grad(conv_sum, (0, 1) if input_grad else (1,), inputs), inputs
    if suite == "attention":
        seq, kind = name.split("_")[:2]
        inputs = tuple(fw.heads(np.random.default_rng(seed).standard_normal(ATTENTION[seq]).astype(np.float32))
                       for seed in range(1, 5))  # q, k, v, and w weighing the outputs in the gradient's loss
        if kind == "fwd":
            return fw.attention, inputs[:3]

        def attention_loss(q, k, v, w):
            return fw.sum(fw.attention(q, k, v) * w)

        return fw.grad(attention_loss, (0, 1, 2), inputs), inputs
    if suite == "transforms":
        return transform_and_inputs(workload, fw)
    raise Unsupported(f"no implementation of {workload.key}")


def mlp_logits(fw, params, x):
    """The transforms' MLP: relu hidden layers; params [w1, b1, w2, b2, ...], weights [in, out]."""
    for i in range(0, len(params) - 2, 2):
        x = fw.relu(fw.matmul(x, params[i]) + params[i + 1])
    return fw.matmul(x, params[-2]) + params[-1]


def mlp_arrays():
    """The transforms' MLP and batch as numpy arrays, from the distributions of xgrad's Mlp and MlpBatch
    (benchmarks/workloads.hpp): [w1, b1, ...] with the hidden layers' weights N(0, 0.05^2), the output
    layer's N(0, 0.1^2), biases zero; x N(0, 1) [TRANSFORMS_BATCH, 784]; labels i * 7 mod classes (int64)."""
    import numpy as np

    rng = np.random.default_rng(1)
    widths, batch, params = TRANSFORMS_MLP, TRANSFORMS_BATCH, []
    for layer in range(len(widths) - 1):
        scale = 0.05 if layer + 2 < len(widths) else 0.1
        params += [(rng.standard_normal((widths[layer], widths[layer + 1])) * scale).astype(np.float32),
                   np.zeros(widths[layer + 1], np.float32)]
    x = np.random.default_rng(42).standard_normal((batch, widths[0])).astype(np.float32)
    return params, x, np.arange(batch) * 7 % widths[-1]


def per_example_problem(fw):
    """(loss, params, xs, labels) of per_example_grads: loss(params, x, label) is the MLP's softmax
    cross-entropy for one example as a batch of one, x [1, 784] and label [1]; xs [batch, 1, 784] and
    labels [batch, 1] hold the examples."""
    params, x, labels = mlp_arrays()

    def loss(params, x, label):
        return fw.cross_entropy(mlp_logits(fw, params, x), label)

    return loss, [fw.tensor(p) for p in params], fw.tensor(x[:, None, :]), fw.tensor(labels[:, None])


def transform_and_inputs(workload, fw):
    """(f, inputs) of a transforms workload (workloads.py has their definitions)."""
    import numpy as np

    if workload.name == "per_example_grads_mlp_b64":
        loss, params, xs, labels = per_example_problem(fw)
        return fw.vmap(fw.grad_of(loss), (None, 0, 0)), (params, xs, labels)
    if workload.name == "hessian_100":
        w = fw.tensor((np.random.default_rng(7).standard_normal((100, 100)) * 0.1).astype(np.float32))

        def f(x):
            return fw.sum(fw.tanh(fw.matmul(w, x))) + 0.5 * fw.sum(x * x) * fw.sum(fw.sin(x))

        return fw.hessian(f), (fw.tensor(np.random.default_rng(8).standard_normal(100).astype(np.float32)),)
    if workload.name == "jvp_mlp_b64":
        params, x, _ = mlp_arrays()
        params = [fw.tensor(p) for p in params]

        def forward(x):
            return mlp_logits(fw, params, x)

        def jvp(x, t):
            return fw.jvp(forward, x, t)

        direction = np.random.default_rng(43).standard_normal(x.shape).astype(np.float32)
        return jvp, (fw.tensor(x), fw.tensor(direction))
    raise Unsupported(f"no implementation of {workload.key}")


def _proc_status_bytes(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return float(line.split()[1]) * 1024.0
    return -1.0


def _reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


_libc = ctypes.CDLL(None)
try:
    _heap_allocations = _libc.xgrad_heap_allocations
    _heap_allocations.restype = ctypes.c_uint64
except AttributeError:  # heap_count not preloaded
    _heap_allocations = None


def _time_batch(call, iterations, wait):
    start = time.perf_counter_ns()
    for _ in range(iterations):
        result = call()
    wait(result)
    return time.perf_counter_ns() - start


def measure(prepare, min_time, warmups, wait):
    """prepare() -> call; wait(result) returns when a call's result is computed. Returns the
    answer for one request (see the module doc)."""
    gc.collect()
    _libc.malloc_trim(0)
    baseline = _proc_status_bytes("VmRSS")
    peak_known = baseline >= 0 and _reset_peak_rss()
    call = prepare()
    _time_batch(call, warmups, wait)  # first-call costs: allocator growth, lazy compiles and their recompiles
    iterations = 1
    while True:
        allocs_before = _heap_allocations() if _heap_allocations else 0
        elapsed = _time_batch(call, iterations, wait)
        allocs = (_heap_allocations() - allocs_before) / iterations if _heap_allocations else None
        if elapsed >= min_time * 1e9 or iterations >= 1_000_000_000:
            break
        # Google Benchmark's rule: aim 40% past min_time, grow at most 10x per step.
        multiplier = min_time * 1e9 * 1.4 / max(elapsed, 1)
        iterations = max(iterations + 1, int(iterations * min(multiplier, 10.0)))
    answer = {"ns": elapsed / iterations, "iterations": iterations, "allocs": allocs}
    if peak_known:
        answer["peak_MiB"] = (_proc_status_bytes("VmHWM") - baseline) / (1024.0 * 1024.0)
    return answer


def serve(name, configure, make_call, wait, threads):
    """The worker loop. configure(threads) imports the framework, sets its thread count and
    returns its version; make_call(workload, mode, threads) -> call, a function returning its
    result, or raises Unsupported (for the compile suite the call compiles afresh each time);
    wait(result) returns when that result is computed."""
    prepared = {}

    def answer(message):
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    try:
        version = configure(threads)
    except Exception as error:  # the framework is absent or broken: say so, do not crash
        answer({"missing": f"{type(error).__name__}: {error}"})
        return
    answer({"ready": True, "peer": name, "version": version, "threads": threads})
    for line in sys.stdin:
        request = json.loads(line)
        key, mode = request["key"], request["mode"]
        workload = BY_KEY.get(key)
        try:
            if workload is None:
                raise Unsupported(f"unknown workload {key}")
            slot = (key, mode)

            def prepare():
                if slot not in prepared:
                    prepared[slot] = make_call(workload, mode, threads)
                return prepared[slot]

            # A train step's optimizer makes its state on the first call, which a tracing
            # compiler sees as a new input: three calls settle every peer; the compile suite's
            # call compiles afresh anyway.
            warmups = 1 if workload.suite == "compile" else 3
            answer(measure(prepare, float(request["min_time"]), warmups, wait))
        except Unsupported as why:
            answer({"unsupported": str(why)})
        except Exception:
            answer({"error": traceback.format_exc(limit=3)})


def main(name, configure, make_call, wait=lambda result: None):
    parser = argparse.ArgumentParser(description=f"{name} worker of the xgrad benchmark suite")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    serve(name, configure, make_call, wait, args.threads)
