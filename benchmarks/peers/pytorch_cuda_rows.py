"""PyTorch on an NVIDIA GPU, the peer of the rows scripts/gpu_check.sh times in xgrad: the same
workloads and shapes as benchmarks/workloads.py (eager, and the 7-op chain under torch.compile),
each timed with CUDA events over batches of 20 calls after a warm-up; the median of 20 batches.
Prints one line per row: "<suite>/<workload>/<side> <microseconds per call> us"."""

import statistics
import sys

import torch

dev = "cuda"
torch.manual_seed(1)


def timed(fn, calls=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(per_call)


def chain7(x):
    return torch.tanh(1.5 * x + 0.25) * torch.sigmoid(x) + x * x


def mlp_step_fn(widths, batch):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    net = torch.nn.Sequential(*layers).to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, widths[0], device=dev)
    y = torch.randint(0, widths[-1], (batch,), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()

    return step


def main():
    a1, b1 = torch.randn(1, device=dev), torch.randn(1, device=dev)
    a6, b6 = torch.randn(10**6, device=dev), torch.randn(10**6, device=dev)
    x7 = torch.randn(10**7, device=dev)
    s = torch.randn(256, 1000, device=dev)
    m1, m2 = torch.rand(1024, 1024, device=dev) * 2 - 1, torch.rand(1024, 1024, device=dev) * 2 - 1
    cx = torch.randn(32, 6, 14, 14, device=dev, requires_grad=True)
    cw = torch.randn(16, 6, 5, 5, device=dev, requires_grad=True)

    def conv2_grad():
        return torch.autograd.grad(torch.nn.functional.conv2d(cx, cw).sum(), [cx, cw])

    rows = {
        "dispatch/add_1": lambda: a1 + b1,
        "elementwise/add_1e6": lambda: a6 + b6,
        "elementwise/chain7_1e7": lambda: chain7(x7),
        "reductions/sum_1e7": lambda: x7.sum(),
        "reductions/softmax_256x1000": lambda: torch.softmax(s, -1),
        "gemm/matmul_1024": lambda: m1 @ m2,
        "conv/conv2_grad": conv2_grad,
        "mlp_step/784-256-256-10_b64": mlp_step_fn([784, 256, 256, 10], 64),
    }
    compiled = {"elementwise/chain7_1e7": torch.compile(chain7)}
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, tf32 matmul "
          f"{torch.backends.cuda.matmul.allow_tf32}", flush=True)
    for name, fn in rows.items():
        print(f"{name}/pytorch_eager {timed(fn):.1f} us", flush=True)
    for name, fn in compiled.items():
        print(f"{name}/torch_compile {timed(lambda: fn(x7)):.1f} us", flush=True)


if __name__ == "__main__":
    sys.exit(main())
