"""The benchmark suite's workloads: one table for the driver (run_suite.py), the report and the
Python peers. xgrad's rows (suite_xgrad.cpp, workloads.hpp) and LibTorch's (suite_libtorch.cpp)
implement the same names with the same shapes and thread counts; a row is named
"<suite>/<workload>/<impl>".
"""

import gzip
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    suite: str
    name: str
    what: str  # the computation and its shapes, for the report
    threads: int = 1
    eager: bool = True  # has an eager implementation (the compile suite has none)
    # Reference impls besides the workload itself: in xgrad_bench ("hand", "openblas", "loop", "forward",
    # "fd_pair"), and in a peer where PEER_REFERENCES lists them.
    references: tuple = ()
    peers: bool = True  # the Python peers implement it (data_parallel: xgrad's two launches only)
    # The work of one call, for the roofline: floating-point operations (a multiply-add is two) of a
    # compute-bound row, or the bytes a memory-bound row must move at the least (each input read once,
    # the output written once); 0 for neither.
    flops: float = 0
    bytes: float = 0

    @property
    def key(self):
        return f"{self.suite}/{self.name}"


SUITES = {
    "dispatch": "per-op overhead: one op on tiny tensors (jit rows: a cache-hit call of the jitted op)",
    "cache_hit": "a cached compiled function called on a 1-element tensor, against the same ops run eagerly",
    "elementwise": "single ops and a 7-op chain y = tanh(1.5x + 0.25) * sigmoid(x) + x * x, float32",
    "reductions": "sums over all or one axis, softmax over the last",
    "gemm": "square float32 matrix products",
    "conv": "conv2d at LeNet5's shapes (batch 32, valid, stride 1, no bias): forward, and the gradient of sum(conv2d(x, w))",
    "mlp_step": "an MLP train step: relu hidden layers, softmax cross-entropy, backward, momentum SGD (lr 0.01, 0.9)",
    "lenet5_step": "the seed's LeNet5 train step: forward, softmax cross-entropy, backward, momentum SGD (lr 0.01, 0.9)",
    "compile": "trace and compile a train step (first-call cost), no run",
    "data_parallel": "a data-parallel train step in graph mode (Model's data_parallel, the global batch split over "
                     "the ranks), 1 process x 2 threads against 2 processes x 1 thread under mpirun; comm share: "
                     "the part of the step a rank spends in collectives, waiting included",
    "roofline": "the machine's measured limits, against which the report reads the other rows: fused multiply-adds "
                "on registers (peak FLOP/s) and STREAM's triad a = b + s c over arrays far beyond the caches "
                "(bandwidth), at 1 and 2 threads",
    "transforms": "function transforms: per-example gradients (vmap of grad), a Hessian, a Jacobian-vector product "
                  "(jvp), each against the plain way of computing the same (a loop of gradients, forward calls)",
    "attention": "causal scaled dot-product attention, q, k, v f32[B, H, T, D] (scale 1 / sqrt(D)): the forward, and "
                 "the gradients of sum(attention(q, k, v) * w) with respect to q, k and v",
    "seq_step": "a character-level transformer language model's train step (examples/char_transformer.cpp): forward, "
                "mean cross-entropy, backward, gradients clipped to global norm 1, AdamW (lr 3e-3, weight decay 0.01)",
}

def mlp_step_flops(widths, batch):
    """An MLP train step's matmul FLOPs: the forward, every weight's gradient (as many again), and
    the gradient of every layer's input but the first."""
    forward = sum(2 * batch * a * b for a, b in zip(widths, widths[1:]))
    inputs = sum(2 * batch * a * b for a, b in zip(widths[1:], widths[2:]))
    return 2 * forward + inputs


CONV1_FLOPS = 2 * 32 * 6 * 28 * 28 * (1 * 5 * 5)  # conv1: [32, 6, 28, 28] outputs of 1 x 5 x 5 multiply-adds
CONV2_FLOPS = 2 * 32 * 16 * 10 * 10 * (6 * 5 * 5)  # conv2: [32, 16, 10, 10] outputs of 6 x 5 x 5
# LeNet5's step: conv1 forward and its weights' gradient; conv2 forward, its weights' and its input's
# gradients; the dense 400-120-84-10 forward, its weights' and its inputs' gradients (pooling and
# activations aside): about 72 MFLOP.
LENET5_DENSE_FLOPS = 2 * 32 * (400 * 120 + 120 * 84 + 84 * 10)
LENET5_STEP_FLOPS = 2 * CONV1_FLOPS + 3 * CONV2_FLOPS + 3 * LENET5_DENSE_FLOPS
# The attention rows' [B, H, T, D] by sequence length, B chosen so one forward call takes milliseconds.
ATTENTION = {"seq128": (8, 4, 128, 32), "seq512": (2, 4, 512, 32), "seq2048": (1, 4, 2048, 32)}


def attention_flops(shape, backward):
    """Causal attention's matmul FLOPs: q k^T and p v over the T (T + 1) / 2 query-key pairs the mask
    keeps, 4 D per pair and head; with the backward (FlashAttention 2's count: q k^T again, dO v^T,
    p^T dO, dS k and dS^T q) 2.5 times the forward more."""
    batch, heads, length, dim = shape
    forward = 4 * batch * heads * length * (length + 1) // 2 * dim
    return forward * 3.5 if backward else forward


def attention_workloads():
    """Forward and gradient at each length on 1 thread, and the longest on 2 threads too (as gemm does)."""
    rows = []
    for seq, shape in ATTENTION.items():
        for threads in (1, 2) if seq == "seq2048" else (1,):
            suffix, on = ("_t2", ", 2 threads") if threads == 2 else ("", "")
            dims = f"q, k, v f32[{', '.join(map(str, shape))}]"
            rows += [Workload("attention", f"{seq}_fwd{suffix}", f"causal attention, {dims}{on}", threads=threads,
                              flops=attention_flops(shape, False)),
                     Workload("attention", f"{seq}_grad{suffix}",
                              f"d/dq, d/dk, d/dv sum(attention(q, k, v) * w), {dims}{on}", threads=threads,
                              flops=attention_flops(shape, True))]
    return rows


# The seq_step suite's char transformer (models::CharTransformer; PyTorch: peers/char_transformer.py) and
# batch: vocabulary 114 (the fortunes' bytes in examples/char_transformer.cpp), no dropout; 32 windows.
CHAR_TRANSFORMER = {"vocab": 114, "context": 128, "width": 128, "heads": 4, "layers": 4}
CHAR_BATCH = 32


def char_transformer_step_flops(vocab, context, width, heads, layers, batch):
    """The char transformer's train step's matmul FLOPs. The forward: per layer and token the
    projections to q, k, v (width x 3 width), the attention's output projection (width x width)
    and the feed-forward part's two (width x 4 width each); the head (width x vocab) per token;
    causal attention over the batch's windows (attention_flops: q k^T and p v over the query-key
    pairs the mask keeps, heads of width / heads). The backward counted as twice the forward
    (each product's two gradients): the step is 3 times the forward. Embeddings, norms and
    elementwise ops aside."""
    tokens = batch * context
    per_token = layers * (width * 3 * width + width * width + 2 * width * 4 * width) + width * vocab
    attention = layers * attention_flops((batch, heads, context, width // heads), False)
    return 3 * (2 * tokens * per_token + attention)


def char_ids(seed):
    """A fixed batch of CHAR_BATCH windows of context ids in [0, vocab), as a flat row-major list:
    id i is splitmix64((seed << 32) + i) mod vocab, the same as xgrad_bench's (workloads.hpp,
    char_ids). Inputs are char_ids(1), targets char_ids(2)."""
    mask = (1 << 64) - 1
    ids = []
    for i in range(CHAR_BATCH * CHAR_TRANSFORMER["context"]):
        x = (((seed << 32) + i) + 0x9E3779B97F4A7C15) & mask
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        ids.append((x ^ (x >> 31)) % CHAR_TRANSFORMER["vocab"])
    return ids


FMA_FLOPS_PER_THREAD = 2**25  # include/xgrad/backend/cpu/peak.hpp, kFmaChainFlops
TRIAD_BYTES = 3 * 4 * 2**24  # STREAM's count: b and c read, a written

WORKLOADS = [
    Workload("roofline", "fma_peak",
             "fused multiply-adds on 12 (below AVX-512) or 16 register accumulators, 2^25 FLOPs per thread",
             eager=False, peers=False, references=("hand",), flops=FMA_FLOPS_PER_THREAD),
    Workload("roofline", "fma_peak_t2", "the same on each of 2 threads", threads=2, eager=False, peers=False,
             references=("hand",), flops=2 * FMA_FLOPS_PER_THREAD),
    Workload("roofline", "triad_2p24", "a = b + 3 c over f32[2^24] arrays (3 x 64 MiB)", eager=False, peers=False,
             references=("hand",), bytes=TRIAD_BYTES),
    Workload("roofline", "triad_2p24_t2", "the same on 2 threads", threads=2, eager=False, peers=False,
             references=("hand",), bytes=TRIAD_BYTES),
    Workload("dispatch", "add_1", "a + b, f32[1]"),
    Workload("dispatch", "add_1000", "a + b, f32[1000]"),
    Workload("dispatch", "add_grad_1", "a + b, f32[1], a requires grad (the op is recorded for backward)"),
    Workload("cache_hit", "chain7_1", "the 7-op chain on f32[1]"),
    Workload("elementwise", "add_1e6", "a + b, f32[1e6]", references=("hand",), bytes=12e6),
    Workload("elementwise", "exp_1e6", "exp(a), f32[1e6]", references=("hand",), bytes=8e6),
    Workload("elementwise", "chain7_1e6", "the 7-op chain, f32[1e6]", references=("hand",), bytes=8e6),
    Workload("elementwise", "chain7_1e7", "the 7-op chain, f32[1e7]", references=("hand",), bytes=8e7),
    Workload("reductions", "sum_1e7", "sum of f32[1e7]", bytes=4e7),
    Workload("reductions", "sum_axis0_1024x1024", "sum over axis 0 of f32[1024, 1024]", bytes=4 * (1024 * 1024 + 1024)),
    Workload("reductions", "sum_axis1_1024x1024", "sum over axis 1 of f32[1024, 1024]", bytes=4 * (1024 * 1024 + 1024)),
    Workload("reductions", "softmax_256x1000", "softmax over the last axis of f32[256, 1000]", bytes=2 * 4 * 256 * 1000),
    Workload("gemm", "matmul_64", "f32[64, 64] @ f32[64, 64]", references=("openblas",), flops=2 * 64**3),
    Workload("gemm", "matmul_256", "f32[256, 256] @ f32[256, 256]", references=("openblas",), flops=2 * 256**3),
    Workload("gemm", "matmul_1024", "f32[1024, 1024] @ f32[1024, 1024]", references=("openblas",), flops=2 * 1024**3),
    Workload("gemm", "matmul_1024_t2", "f32[1024, 1024] @ f32[1024, 1024], 2 threads", threads=2,
             references=("openblas",), flops=2 * 1024**3),
    Workload("conv", "conv1_fwd", "conv2d f32[32, 1, 32, 32] * f32[6, 1, 5, 5]", flops=CONV1_FLOPS),
    Workload("conv", "conv2_fwd", "conv2d f32[32, 6, 14, 14] * f32[16, 6, 5, 5]", flops=CONV2_FLOPS),
    Workload("conv", "conv1_grad", "d/dw sum(conv2d(x, w)), conv1's shapes", flops=CONV1_FLOPS),
    Workload("conv", "conv2_grad", "d/dx and d/dw sum(conv2d(x, w)), conv2's shapes", flops=2 * CONV2_FLOPS),
    Workload("mlp_step", "784-128-10_b32", "MLP 784-128-10, batch 32", flops=mlp_step_flops([784, 128, 10], 32)),
    Workload("mlp_step", "784-256-256-10_b64", "MLP 784-256-256-10, batch 64", flops=mlp_step_flops([784, 256, 256, 10], 64)),
    Workload("lenet5_step", "b32_t1", "LeNet5, batch 32 of f32[1, 32, 32], 1 thread", flops=LENET5_STEP_FLOPS),
    Workload("lenet5_step", "b32_t2", "LeNet5, batch 32 of f32[1, 32, 32], 2 threads", threads=2, flops=LENET5_STEP_FLOPS),
    Workload("compile", "mlp_784-256-256-10_b64", "the MLP 784-256-256-10 train step (batch 64)", eager=False),
    Workload("compile", "lenet5_step_b32", "the LeNet5 train step (batch 32)", eager=False),
    Workload("data_parallel", "lenet5_b32", "LeNet5, global batch 32, 100 steps", threads=2, eager=False,
             peers=False),
    Workload("data_parallel", "mlp_784-256-256-10_b64", "MLP 784-256-256-10, global batch 64, 100 steps", threads=2,
             eager=False, peers=False),
    Workload("transforms", "per_example_grads_mlp_b64",
             "the gradients of every weight and bias of the MLP 784-256-256-10 (relu, softmax cross-entropy) for each "
             "of 64 examples, each a batch of one (x f32[1, 784], an int label): vmap(grad(loss)), the weights shared; "
             "reference loop: 64 gradient calls, one per example", references=("loop",)),
    Workload("transforms", "hessian_100",
             "the Hessian f32[100, 100] of f(x) = sum(tanh(W x)) + 0.5 * sum(x * x) * sum(sin(x)), x f32[100], "
             "W f32[100, 100] N(0, 0.1^2)"),
    Workload("transforms", "jvp_mlp_b64",
             "jvp of the MLP 784-256-256-10's logits for a batch of 64 (f32[64, 784]) along a direction of the input; "
             "references: one forward call, and a finite difference (f(x + h t) - f(x)) / h",
             references=("forward", "fd_pair")),
    *attention_workloads(),
    Workload("seq_step", "char_transformer_b32",
             "char transformer (vocabulary 114, context 128, width 128, 4 heads, 4 pre-norm causal layers), batch 32 "
             "windows of 128 ids", flops=char_transformer_step_flops(**CHAR_TRANSFORMER, batch=CHAR_BATCH)),
]

BY_KEY = {w.key: w for w in WORKLOADS}

# What each side runs: xgrad's implementations, the references in xgrad_bench, the Python peers'
# modes. A peer's "eager" mode runs op by op; its compiled mode traces/compiles first.
XGRAD_IMPLS = ["eager", "jit_O0", "jit_O1", "jit_O2"]
PEER_MODES = {
    "pytorch": ["eager", "compile"],  # torch.compile (inductor)
    "jax": ["eager", "jit"],  # op-by-op dispatch; jax.jit
    "mindspore": ["pynative", "graph"],  # PyNative; mindspore.jit (GRAPH_MODE)
}
# References a peer runs besides its modes, for the workloads that list them in `references`.
PEER_REFERENCES = {"pytorch": ["loop"]}  # one torch.autograd.grad call per example
PEER_IMPORT = {"pytorch": "torch", "jax": "jax", "mindspore": "mindspore"}

# LeNet5 on the seed's recipe: the 10 classes, SoftmaxCrossEntropy (sparse, mean), Momentum.
LENET_BATCH = 32


def fashion_mnist_batch():
    """The LeNet5 rows' batch, as xgrad_bench makes it (suite.hpp: lenet_batch): the first 32
    train images of Fashion-MNIST (Debian's dataset-fashion-mnist, or $XGRAD_FASHION_MNIST),
    resized bilinearly to 32x32 (pixel centres at half-integers, source clamped to the image),
    divided by 255, normalized by 0.1307 and 0.3081: (float32 [32, 1, 32, 32], int32 [32])."""
    import numpy as np  # the peers' environments have it; the driver does not need it

    directory = os.environ.get("XGRAD_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")

    def read(name, header):
        for path in (os.path.join(directory, name), os.path.join(directory, name + ".gz")):
            if os.path.exists(path):
                with (gzip.open if path.endswith(".gz") else open)(path, "rb") as file:
                    return np.frombuffer(file.read(), np.uint8, offset=header)
        raise FileNotFoundError(f"Fashion-MNIST: neither {name} nor {name}.gz in {directory}")

    images = read("train-images-idx3-ubyte", 16)[: LENET_BATCH * 28 * 28].reshape(LENET_BATCH, 28, 28)
    labels = read("train-labels-idx1-ubyte", 8)[:LENET_BATCH].astype(np.int32)
    source = np.clip((np.arange(32) + 0.5) * 28 / 32 - 0.5, 0, 27)
    low = source.astype(np.int64)
    high = np.minimum(low + 1, 27)
    weight = (source - low).astype(np.float32)
    pixels = images.astype(np.float32)
    rows = pixels[:, low, :] * (1 - weight)[:, None] + pixels[:, high, :] * weight[:, None]
    resized = rows[:, :, low] * (1 - weight) + rows[:, :, high] * weight
    normalized = (resized / 255.0 - 0.1307) / 0.3081
    return normalized.astype(np.float32).reshape(LENET_BATCH, 1, 32, 32), labels
CHAIN7 = "tanh(1.5x + 0.25) * sigmoid(x) + x * x"


# The transforms suite's MLP and batch (per_example_grads, jvp): mlp_step's deep MLP.
TRANSFORMS_MLP, TRANSFORMS_BATCH = [784, 256, 256, 10], 64


def mlp_widths(name):
    """"784-256-256-10_b64" -> ([784, 256, 256, 10], 64)"""
    widths, batch = name.split("_b")
    return [int(w) for w in widths.split("-")], int(batch)


CONV = {  # name: (x shape, w shape, gradient with respect to x too)
    "conv1": ((32, 1, 32, 32), (6, 1, 5, 5), False),
    "conv2": ((32, 6, 14, 14), (16, 6, 5, 5), True),
}
