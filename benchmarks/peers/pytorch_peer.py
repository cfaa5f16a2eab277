"""PyTorch worker of the benchmark suite (harness.py has the protocol): eager and torch.compile, and for
the per-example gradients a loop of torch.autograd.grad calls ("loop"). The transforms are torch.func's."""

import os
import types

import harness
from harness import Unsupported
from workloads import CHAR_BATCH, CHAR_TRANSFORMER, char_ids, fashion_mnist_batch, mlp_widths

torch = None  # imported in version_of, so a missing PyTorch is reported, not raised at import


def version_of():
    global torch
    # Compile from scratch: inductor's on-disk caches would turn the compile suite into cache hits.
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
    import torch as module

    torch = module
    return torch.__version__


def configure(threads):
    version = version_of()
    torch.set_num_threads(threads)
    return version


def primitives():
    """The ops harness.function_and_inputs builds the one-function workloads from."""

    def softmax(x):
        return torch.softmax(x, -1)

    def total(x, axis=None):
        return x.sum() if axis is None else x.sum(axis)

    def grad(f, argnums, inputs):
        for i in argnums:
            inputs[i].requires_grad_()

        def gradients(*args):
            return torch.autograd.grad(f(*args), [args[i] for i in argnums])

        return gradients

    def vmap(f, in_axes):
        return torch.func.vmap(f, in_dims=in_axes)

    def jvp(f, x, t):
        return torch.func.jvp(f, (x,), (t,))

    def attention(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    return types.SimpleNamespace(
        tensor=torch.from_numpy, add=torch.add, exp=torch.exp, tanh=torch.tanh, sigmoid=torch.sigmoid,
        matmul=torch.matmul, conv2d=torch.nn.functional.conv2d, softmax=softmax, sum=total, grad=grad,
        recorded=lambda x: x.requires_grad_(), relu=torch.relu, sin=torch.sin,
        cross_entropy=torch.nn.functional.cross_entropy, grad_of=torch.func.grad, vmap=vmap,
        hessian=torch.func.hessian, jvp=jvp, attention=attention, heads=torch.from_numpy)


def lenet5(dense_std=None):
    """The seed's LeNet5: valid 5x5 convolutions without bias, ReLU, 2x2 max pooling, dense 120-84-10;
    dense_std: the dense weights drawn from N(0, dense_std^2) as in the notebook (None: PyTorch's default)."""
    nn = torch.nn
    net = nn.Sequential(
        nn.Conv2d(1, 6, 5, bias=False), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5, bias=False), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))
    for layer in net:
        if dense_std is not None and isinstance(layer, nn.Linear):
            nn.init.normal_(layer.weight, 0.0, dense_std)
    return net


def mlp(widths):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def train_step(net, inputs, labels):
    """The step as a function: forward, mean cross-entropy, backward, momentum SGD."""
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    def step():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(inputs), labels)
        loss.backward()
        optimizer.step()
        return loss

    return step


def model_step(workload):
    """The train step (and its inputs) of an mlp_step, lenet5_step or compile workload."""
    torch.manual_seed(1)
    if workload.suite == "lenet5_step" or workload.name.startswith("lenet5"):
        images, labels = fashion_mnist_batch()
        return train_step(lenet5(), torch.from_numpy(images), torch.from_numpy(labels).long())
    widths, batch = mlp_widths(workload.name.removeprefix("mlp_"))
    inputs = torch.randn(batch, widths[0], generator=torch.Generator().manual_seed(42))
    return train_step(mlp(widths), inputs, torch.arange(batch) * 7 % widths[-1])


def char_transformer_step():
    """The seq_step workload: char_transformer.py's CharTransformer (this directory; the model
    examples/char_transformer.cpp trains) and its recipe's step on one fixed batch of ids (workloads.py,
    char_ids): mean cross-entropy, backward, gradients clipped to global norm 1, AdamW (lr 3e-3, weight
    decay 0.01)."""
    from char_transformer import CharTransformer, train_step  # imports torch: only once configure has

    torch.manual_seed(1)
    model = CharTransformer(**CHAR_TRANSFORMER)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    shape = (CHAR_BATCH, CHAR_TRANSFORMER["context"])
    inputs, targets = (torch.tensor(char_ids(seed), dtype=torch.int64).reshape(shape) for seed in (1, 2))

    step = train_step(model, optimizer)
    return lambda: step(inputs, targets)


def gradient_loop():
    """The per-example gradients' reference: one torch.autograd.grad call per example."""
    loss, params, xs, labels = harness.per_example_problem(primitives())
    for p in params:
        p.requires_grad_()
    examples = list(zip(xs, labels))

    def loop():
        return [torch.autograd.grad(loss(params, x, label), params) for x, label in examples]

    return loop


def make_call(workload, mode, threads):
    if mode not in ("eager", "compile", "loop"):
        raise Unsupported(f"unknown mode {mode}")
    if mode == "loop":
        if workload.key != "transforms/per_example_grads_mlp_b64":
            raise Unsupported("the loop of gradients is the per-example gradients' reference")
        return gradient_loop()
    if workload.suite == "compile":
        if mode != "compile":
            raise Unsupported("the compile suite times compilers")

        def compile_afresh():
            torch._dynamo.reset()  # forget compiled code: each call compiles again
            return torch.compile(model_step(workload))()

        return compile_afresh
    if workload.suite in ("mlp_step", "lenet5_step", "seq_step"):
        step = char_transformer_step() if workload.suite == "seq_step" else model_step(workload)
        return step if mode == "eager" else torch.compile(step)
    f, inputs = harness.function_and_inputs(workload, primitives())
    if mode == "compile":
        f = torch.compile(f)
    return lambda: f(*inputs)


if __name__ == "__main__":
    harness.main("pytorch", configure, make_call)
