#!/usr/bin/env python3
"""Writes tests/autograd/transform_reference.txt: PyTorch's torch.autograd.functional results
(jacobian, hessian, jvp, vjp, hvp) for a few float64 functions, which
tests/autograd/test_transform_reference.cpp writes again with xgrad and checks xgrad's
transforms against, eagerly and under jit. PyTorch is an independent implementation of the
same derivatives, so a rule wrong in xgrad shows up as a mismatch rather than agreeing with
itself.

PyTorch is needed only to regenerate the file (the test reads the committed file). From PyPI
into a virtual environment, then run from anywhere:

    python3 -m venv /tmp/torch-venv
    /tmp/torch-venv/bin/pip install torch
    /tmp/torch-venv/bin/python scripts/gen_transform_reference.py [OUTPUT]

(the PyTorch peer of the benchmarks, build-bench/peers-venv/pytorch from
benchmarks/peers/setup_venv.sh, does as well). OUTPUT defaults to
tests/autograd/transform_reference.txt. Everything runs on the CPU in float64. The inputs come
from a seeded generator and are written into the file, so the test never depends on PyTorch's
random streams; a rerun with the same PyTorch version writes the same file.

Each function is written once here and once in the test with the same ops (xgrad's conv2d,
pooling, softmax_cross_entropy, cond, fori_loop and while_loop have PyTorch's semantics for
these arguments; the control flow is plain Python here). The script checks that every input
sits away from a kink (relu at 0, a max-pooling tie, a branch or loop condition at its
threshold), where the two libraries could legitimately differ.

File format, one tensor a line:  <case> <name> <shape> <value>...
  shape: [d0,d1,...] ([] for a scalar); values row-major, 17 significant digits (exact doubles).
  names: arg0, arg1 (inputs), the function's constants (weight, bias, labels, coef, ...),
  tangent0, tangent1 (for jvp and hvp), cotangent (for vjp), and the results: value, jacobian<i>,
  jvp, vjp<i>, and for a scalar function hessian<i><j> (d2f / d arg_i d arg_j) and hvp<i>.
Lines starting with '#' are comments.
"""

import math
import os
import sys

import torch
import torch.nn.functional as F
from torch.autograd import functional as AF

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUTPUT = os.path.join(REPO, "tests", "autograd", "transform_reference.txt")
SEED = 24
# Distance kept from every kink and threshold.
MARGIN = 1e-3
# xgrad's while_loop bound in the test; the loops here must stop well before it.
MAX_ITERS = 50


def randn(gen, *shape, scale=1.0):
    return torch.randn(shape, generator=gen, dtype=torch.float64) * scale


def require(ok, what):
    if not ok:
        raise SystemExit(f"gen_transform_reference: {what}")


def away_from_zero(t, what):
    require(bool((t.abs() > MARGIN).all()), f"{what}: a value within {MARGIN} of 0")


def no_pool_ties(t, what):
    windows = t.unfold(2, 2, 2).unfold(3, 2, 2).reshape(*t.shape[:2], t.shape[2] // 2, t.shape[3] // 2, 4)
    top2 = windows.topk(2, dim=-1).values
    require(bool(((top2[..., 0] - top2[..., 1]) > MARGIN).all()), f"{what}: a 2x2 window without a clear maximum")


# Each case: its constants, its input(s), and the function of the inputs. A function returning a
# scalar also gets hessian and hvp.


def mlp_tanh(gen):
    consts = {"weight": randn(gen, 4, 5, scale=0.7), "bias": randn(gen, 5, scale=0.3)}

    def f(x):
        return torch.tanh(x @ consts["weight"] + consts["bias"]).sum()

    return consts, [randn(gen, 3, 4)], f


def softmax_rows(gen):
    consts = {"coef": randn(gen, 4)}

    def f(x):
        return F.softmax(x, dim=-1) * consts["coef"] + F.log_softmax(x, dim=-1) * 0.5

    return consts, [randn(gen, 2, 4)], f


def cross_entropy(gen):
    consts = {"weight": randn(gen, 3, 5, scale=0.8), "labels": torch.tensor([3.0, 0.0, 4.0, 1.0], dtype=torch.float64),
              "coef": randn(gen, 5)}

    def f(x):
        logits = x @ consts["weight"]
        return F.cross_entropy(logits, consts["labels"].long()) + (F.softmax(logits, dim=-1) * consts["coef"]).sum()

    return consts, [randn(gen, 4, 3)], f


def conv_tanh(gen):
    consts = {"weight": randn(gen, 3, 2, 3, 3, scale=0.4), "bias": randn(gen, 3, scale=0.2)}

    def f(x):
        return torch.tanh(F.conv2d(x, consts["weight"], consts["bias"])).square().sum()

    return consts, [randn(gen, 1, 2, 5, 5)], f


def conv_pool(gen):
    consts = {"weight": randn(gen, 2, 1, 3, 3, scale=0.5), "coef": randn(gen, 3)}
    x = randn(gen, 1, 1, 6, 6)

    def f(x):
        y = F.conv2d(x, consts["weight"], padding=1)
        peaks = torch.relu(F.max_pool2d(y, 2, 2))
        return peaks.square().sum() + (F.avg_pool2d(torch.tanh(y), 2, 2) * consts["coef"]).sum()

    y = F.conv2d(x, consts["weight"], padding=1)
    no_pool_ties(y, "conv_pool")
    away_from_zero(F.max_pool2d(y, 2, 2), "conv_pool: relu's input")
    return consts, [x], f


class WhileLoop:
    """Python's while with xgrad's bound (while_loop's max_iters in the test), remembering how
    many trips each run made and how far each test of the condition was from flipping."""

    def __init__(self):
        self.trips, self.gaps = [], []

    def __call__(self, gap, body, y):
        n = 0
        while n < MAX_ITERS:
            g = float(gap(y).detach())  # > 0: go on
            self.gaps.append(abs(g))
            if g <= 0:
                break
            y = body(y)
            n += 1
        self.trips.append(n)
        return y

    def check(self, case):
        require(0 < min(self.trips) and max(self.trips) < MAX_ITERS, f"{case}: the loop ran {self.trips} times")
        require(min(self.gaps) > MARGIN, f"{case}: a loop condition within {MARGIN} of its threshold")


def control_flow(gen):
    # cond takes its first branch (sum(x) > 0), then 3 trips of a recurrent layer, then a loop
    # that grows the state until its squared norm reaches a threshold.
    consts = {"weight": randn(gen, 3, 3, scale=0.6), "bias": randn(gen, 3, scale=0.2),
              "threshold": torch.tensor(20.0, dtype=torch.float64)}
    x = randn(gen, 2, 3).abs() * 0.8
    loop = WhileLoop()

    def f(x):
        y = torch.tanh(x) * 2.0 if x.sum() > 0 else x * x - 1.0
        for i in range(3):
            y = torch.tanh(y @ consts["weight"] + consts["bias"] + 0.1 * i)
        y = loop(lambda c: consts["threshold"] - (c * c).sum(), lambda c: c * 1.5 + 0.1 * torch.sin(c), y)
        return (y * y).sum() * 0.5

    require(float(x.sum()) > MARGIN, "control_flow: cond's predicate too close to its threshold")
    f(x)
    loop.check("control_flow")
    return consts, [x], f


def cond_else_while(gen):
    # cond takes its second branch (sum(x) <= 0), then a loop that shrinks the state below a
    # threshold; a vector result whose elements the loop couples (a full Jacobian).
    consts = {"threshold": torch.tensor(0.5, dtype=torch.float64)}
    x = -randn(gen, 5).abs() - 0.2
    loop = WhileLoop()

    def f(x):
        y = torch.sin(x) * 3.0 if x.sum() > 0 else x * x + x
        return loop(lambda c: (c * c).sum() - consts["threshold"], lambda c: c * 0.7 + 0.05 * torch.sin(c.sum()), y)

    require(float(x.sum()) < -MARGIN, "cond_else_while: cond's predicate too close to its threshold")
    f(x)
    loop.check("cond_else_while")
    return consts, [x], f


def two_args(gen):
    def f(x, w):
        return torch.tanh(x @ w).sum()

    return {}, [randn(gen, 3, 4), randn(gen, 4, 2, scale=0.6)], f


CASES = [mlp_tanh, softmax_rows, cross_entropy, conv_tanh, conv_pool, control_flow, cond_else_while, two_args]


def results(f, inputs, tangents, cotangent):
    out = {}
    value = f(*inputs)
    out["value"] = value.detach()
    jac = AF.jacobian(f, tuple(inputs))
    for i, j in enumerate(jac):
        out[f"jacobian{i}"] = j
    _, jvp = AF.jvp(f, tuple(inputs), tuple(tangents))
    out["jvp"] = jvp
    _, vjp = AF.vjp(f, tuple(inputs), cotangent)
    for i, g in enumerate(vjp):
        out[f"vjp{i}"] = g
    if value.dim() == 0:
        hess = AF.hessian(f, tuple(inputs))
        for i, row in enumerate(hess):
            for j, h in enumerate(row):
                out[f"hessian{i}{j}"] = h
        _, hvp = AF.hvp(f, tuple(inputs), tuple(tangents))
        for i, h in enumerate(hvp):
            out[f"hvp{i}"] = h
    return out


def line(case, name, t):
    t = t.detach().to(torch.float64).contiguous()
    values = " ".join(format(v, ".17g") for v in t.reshape(-1).tolist())
    require(all(math.isfinite(v) for v in t.reshape(-1).tolist()), f"{case}.{name} is not finite")
    shape = "[" + ",".join(str(d) for d in t.shape) + "]"
    return f"{case} {name} {shape} {values}"


def main():
    output = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUTPUT
    torch.use_deterministic_algorithms(True)
    lines = [
        "# Reference derivatives from torch.autograd.functional for tests/autograd/test_transform_reference.cpp.",
        f"# Generated by scripts/gen_transform_reference.py (torch {torch.__version__}, seed {SEED}); do not edit.",
        "# <case> <name> <shape> <values...>",
    ]
    gen = torch.Generator().manual_seed(SEED)
    for make in CASES:
        case = make.__name__
        consts, inputs, f = make(gen)
        tangents = [randn(gen, *x.shape) for x in inputs]
        value = f(*inputs)
        cotangent = randn(gen, *value.shape)
        for name, t in consts.items():
            lines.append(line(case, name, t))
        for i, x in enumerate(inputs):
            lines.append(line(case, f"arg{i}", x))
        for i, t in enumerate(tangents):
            lines.append(line(case, f"tangent{i}", t))
        lines.append(line(case, "cotangent", cotangent))
        for name, t in results(f, inputs, tangents, cotangent).items():
            lines.append(line(case, name, t))
    with open(output, "w") as out:
        out.write("\n".join(lines) + "\n")
    print(f"wrote {output}: {len(CASES)} cases, {os.path.getsize(output)} bytes")


if __name__ == "__main__":
    main()
