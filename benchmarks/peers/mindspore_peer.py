"""MindSpore worker of the benchmark suite (harness.py has the protocol): PyNative ("pynative")
and mindspore.jit ("graph", GRAPH_MODE for the function), on the CPU.

The train steps follow the seed notebook: value_and_grad over the optimizer's parameters, then
the optimizer applied to the gradients, in one function that mindspore.jit compiles whole.
MindSpore dispatches asynchronously: each timed batch waits for its last result (harness.py).
"""

import types

import harness
from harness import Unsupported
from workloads import fashion_mnist_batch, mlp_widths

ms = nn = ops = np = None  # imported in configure, so a missing MindSpore is reported


def configure(threads):
    global ms, nn, ops, np
    import mindspore
    import numpy

    ms, nn, ops, np = mindspore, mindspore.nn, mindspore.ops, numpy
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    from mindspore.device_context.cpu import op_tuning

    op_tuning.threads_num(threads)  # the threads of MindSpore's CPU kernels
    return ms.__version__


def randn(*shape, seed=1):
    return ms.Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def conv2d(x, w):
    return ops.conv2d(x, w, pad_mode="valid")


def primitives():
    """The ops harness.function_and_inputs builds the one-function workloads from (defs, not
    lambdas: mindspore.jit parses their source)."""

    def softmax(x):
        return ops.softmax(x, -1)

    def total(x, axis=None):
        return ops.sum(x, axis)

    def grad(f, argnums, inputs):
        return ms.grad(f, grad_position=argnums)

    def recorded(x):
        raise Unsupported("MindSpore records no tape in PyNative: gradients are function transforms")

    return types.SimpleNamespace(
        tensor=ms.Tensor, add=ops.add, exp=ops.exp, tanh=ops.tanh, sigmoid=ops.sigmoid, matmul=ops.matmul,
        conv2d=conv2d, softmax=softmax, sum=total, grad=grad, recorded=recorded)


def lenet5(dense_weights=None):
    """The seed's LeNet5 (MindSpore's defaults: no conv bias); dense_weights: the dense layers'
    weight_init (the notebook's is Normal(0.02); None: MindSpore's default)."""
    return nn.SequentialCell(
        nn.Conv2d(1, 6, 5, pad_mode="valid"), nn.ReLU(), nn.MaxPool2d(kernel_size=2, stride=2),
        nn.Conv2d(6, 16, 5, pad_mode="valid"), nn.ReLU(), nn.MaxPool2d(kernel_size=2, stride=2),
        nn.Flatten(), nn.Dense(400, 120, weight_init=dense_weights), nn.ReLU(),
        nn.Dense(120, 84, weight_init=dense_weights), nn.ReLU(), nn.Dense(84, 10, weight_init=dense_weights))


def mlp(widths):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Dense(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(nn.ReLU())
    return nn.SequentialCell(*layers)


def model(workload):
    """(step, x, labels) of an mlp_step, lenet5_step or compile workload: the seed's train step."""
    ms.set_seed(1)
    if workload.suite == "lenet5_step" or workload.name.startswith("lenet5"):
        images, labels = fashion_mnist_batch()
        net, x, labels = lenet5(), ms.Tensor(images), ms.Tensor(labels)
    else:
        widths, batch = mlp_widths(workload.name.removeprefix("mlp_"))
        net, x = mlp(widths), randn(batch, widths[0], seed=42)
        labels = ms.Tensor((np.arange(batch) * 7 % widths[-1]).astype(np.int32))
    return seed_train_step(net), x, labels


def seed_train_step(net):
    """The seed notebook's train step of net: mean sparse softmax cross-entropy, momentum SGD (lr 0.01, 0.9)."""
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)

    def forward(data, label):  # a def, not a lambda: mindspore.jit parses the source
        return loss_fn(net(data), label)

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

    def train_step(data, label):
        loss, grads = grad_fn(data, label)
        optimizer(grads)
        return loss

    return train_step


def make_call(workload, mode, threads):
    if mode not in ("pynative", "graph"):
        raise Unsupported(f"unknown mode {mode}")
    if workload.suite == "compile":
        if mode != "graph":
            raise Unsupported("the compile suite times compilers")

        def compile_afresh():  # a fresh model and jit each time: nothing compiled to reuse
            step, x, labels = model(workload)
            return ms.jit(step)(x, labels)

        return compile_afresh
    if workload.suite == "transforms":
        raise Unsupported("the transforms suite has no MindSpore implementation yet")
    if workload.suite == "seq_step":
        raise Unsupported("no MindSpore char transformer yet (peers/char_transformer.py's model is PyTorch's)")
    if workload.suite == "attention":
        raise Unsupported("MindSpore's fused attention (ops.flash_attention_score) runs on Ascend only, not the CPU")
    if workload.suite in ("mlp_step", "lenet5_step"):
        step, x, labels = model(workload)
        inputs = (x, labels)
    else:
        step, inputs = harness.function_and_inputs(workload, primitives())
    if mode == "graph":
        step = ms.jit(step)

    return lambda: step(*inputs)


def wait(result):
    """Blocks until result (a tensor or a tuple of them) is computed."""
    first = result[0] if isinstance(result, (tuple, list)) else result
    first.asnumpy()


if __name__ == "__main__":
    harness.main("mindspore", configure, make_call, wait)
