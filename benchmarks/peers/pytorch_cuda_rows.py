"""PyTorch on an NVIDIA GPU, the peer of the rows scripts/gpu_check.sh times in xgrad: the same
workloads and shapes as benchmarks/workloads.py (eager, and the 7-op chain under torch.compile),
each timed with CUDA events over batches of 20 calls after a warm-up; the median of 20 batches.
Prints one line per row: "<suite>/<workload>/<side> <microseconds per call> us"."""

import statistics
import sys

import torch

from char_transformer import CharTransformer, train_step

dev = "cuda"
# benchmarks/workloads.py's ATTENTION shapes [B, H, T, D] and the seq_step model (CHAR_TRANSFORMER).
ATTENTION = {"seq128": (8, 4, 128, 32), "seq512": (2, 4, 512, 32), "seq2048": (1, 4, 2048, 32)}
CHAR_VOCAB, CHAR_CONTEXT, CHAR_BATCH = 114, 128, 32
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


def attention_rows():
    """Causal scaled_dot_product_attention and the gradients of sum(attention * w) by q, k, v."""
    rows = {}
    for seq, shape in ATTENTION.items():
        q, k, v = (torch.randn(*shape, device=dev, requires_grad=True) for _ in range(3))
        w = torch.randn(*shape, device=dev)

        def forward(q=q, k=k, v=v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

        def grads(q=q, k=k, v=v, w=w, forward=forward):
            return torch.autograd.grad((forward(q, k, v) * w).sum(), [q, k, v])

        rows[f"attention/{seq}_fwd"] = lambda forward=forward: forward()
        rows[f"attention/{seq}_grad"] = grads
    return rows


def char_transformer_step():
    """The seq_step row: the example's model and recipe (peers/char_transformer.py) on one batch."""
    model = CharTransformer(CHAR_VOCAB, CHAR_CONTEXT, 128, 4, 4).to(dev)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    step = train_step(model, optimizer)
    ids = torch.randint(0, CHAR_VOCAB, (CHAR_BATCH, CHAR_CONTEXT + 1), device=dev)
    return lambda: step(ids[:, :-1], ids[:, 1:])


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
        **attention_rows(),
        "seq_step/char_transformer_b32": char_transformer_step(),
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
