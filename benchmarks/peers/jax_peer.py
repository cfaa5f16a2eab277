"""JAX worker of the benchmark suite (harness.py has the protocol): op-by-op ("eager") and jax.jit.

JAX dispatches asynchronously: each timed batch waits for its last result (harness.py). Thread counts are set through XLA_FLAGS
before JAX is imported (run_suite.py also pins the worker to that many cores).
"""

import os
import types

import harness
from harness import Unsupported
from workloads import fashion_mnist_batch, mlp_widths

jax = jnp = None  # imported in version_of, so a missing JAX is reported, not raised at import


def configure(threads):
    if threads == 1:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip()
    return version_of()


def version_of():
    global jax, jnp
    import jax as module

    jax, jnp = module, module.numpy
    jax.config.update("jax_platforms", "cpu")
    return jax.__version__


def randn(*shape, seed=1):
    return jax.random.normal(jax.random.PRNGKey(seed), shape, dtype=jnp.float32)


def conv2d(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "VALID")


def max_pool(x):
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")


def primitives():
    """The ops harness.function_and_inputs builds the one-function workloads from."""

    def softmax(x):
        return jax.nn.softmax(x, axis=-1)

    def total(x, axis=None):
        return jnp.sum(x, axis=axis)

    def grad(f, argnums, inputs):
        return jax.grad(f, argnums=argnums)

    def recorded(x):
        raise Unsupported("JAX records no tape: gradients are function transforms")

    def vmap(f, in_axes):
        return jax.vmap(f, in_axes=in_axes)

    def jvp(f, x, t):
        return jax.jvp(f, (x,), (t,))

    def attention(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True)

    def heads(array):  # [B, H, T, D] -> jax.nn.dot_product_attention's [B, T, H, D], made before the timing
        return jnp.asarray(array.swapaxes(1, 2))

    return types.SimpleNamespace(
        tensor=jnp.asarray, add=jnp.add, exp=jnp.exp, tanh=jnp.tanh, sigmoid=jax.nn.sigmoid, matmul=jnp.matmul,
        conv2d=conv2d, softmax=softmax, sum=total, grad=grad, recorded=recorded, relu=jax.nn.relu, sin=jnp.sin,
        cross_entropy=cross_entropy, grad_of=jax.grad, vmap=vmap, hessian=jax.hessian, jvp=jvp, attention=attention,
        heads=heads)


def dense_init(key, fan_in, fan_out):
    bound = 1.0 / fan_in ** 0.5
    return jax.random.uniform(key, (fan_in, fan_out), jnp.float32, -bound, bound), jnp.zeros(fan_out, jnp.float32)


def lenet5_params():
    keys = jax.random.split(jax.random.PRNGKey(1), 5)
    conv = [jax.random.uniform(keys[0], (6, 1, 5, 5), jnp.float32, -0.2, 0.2),
            jax.random.uniform(keys[1], (16, 6, 5, 5), jnp.float32, -0.08, 0.08)]
    return {"conv": conv, "dense": [dense_init(keys[2], 400, 120), dense_init(keys[3], 120, 84),
                                    dense_init(keys[4], 84, 10)]}


def lenet5_forward(params, x):
    for w in params["conv"]:
        x = max_pool(jax.nn.relu(conv2d(x, w)))
    x = x.reshape(x.shape[0], -1)
    *hidden, (w, b) = params["dense"]
    for hw, hb in hidden:
        x = jax.nn.relu(x @ hw + hb)
    return x @ w + b


def mlp_params(widths):
    keys = jax.random.split(jax.random.PRNGKey(1), len(widths) - 1)
    return {"dense": [dense_init(keys[i], widths[i], widths[i + 1]) for i in range(len(widths) - 1)]}


def mlp_forward(params, x):
    *hidden, (w, b) = params["dense"]
    for hw, hb in hidden:
        x = jax.nn.relu(x @ hw + hb)
    return x @ w + b


def cross_entropy(logits, labels):
    """Softmax cross-entropy against sparse labels, the mean over the batch."""
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))


def train_step_function(forward):
    """(params, velocity, x, labels) -> (loss, params, velocity): mean cross-entropy, momentum SGD."""

    def loss_of(params, x, labels):
        return cross_entropy(forward(params, x), labels)

    def step(params, velocity, x, labels):
        loss, grads = jax.value_and_grad(loss_of)(params, x, labels)
        velocity = jax.tree_util.tree_map(lambda v, g: 0.9 * v + g, velocity, grads)
        params = jax.tree_util.tree_map(lambda p, v: p - 0.01 * v, params, velocity)
        return loss, params, velocity

    return step


def model(workload):
    """(step function, params, x, labels) of an mlp_step, lenet5_step or compile workload."""
    if workload.suite == "lenet5_step" or workload.name.startswith("lenet5"):
        images, labels = fashion_mnist_batch()
        return train_step_function(lenet5_forward), lenet5_params(), jnp.asarray(images), jnp.asarray(labels)
    widths, batch = mlp_widths(workload.name.removeprefix("mlp_"))
    labels = jnp.arange(batch) * 7 % widths[-1]
    return train_step_function(mlp_forward), mlp_params(widths), randn(batch, widths[0], seed=42), labels


def make_call(workload, mode, threads):
    if mode not in ("eager", "jit"):
        raise Unsupported(f"unknown mode {mode}")
    if workload.suite == "compile":
        if mode != "jit":
            raise Unsupported("the compile suite times compilers")
        step, params, x, labels = model(workload)
        velocity = jax.tree_util.tree_map(jnp.zeros_like, params)

        def compile_afresh():  # a new function object each time: nothing cached to reuse
            jax.jit(lambda *args: step(*args)).lower(params, velocity, x, labels).compile()

        return compile_afresh
    if workload.suite == "seq_step":
        raise Unsupported("no JAX char transformer yet: JAX has no transformer layers of its own (they come from "
                          "Flax or Equinox), and the peer is written on jax alone")
    if workload.suite in ("mlp_step", "lenet5_step"):
        step, params, x, labels = model(workload)
        if mode == "jit":
            step = jax.jit(step, donate_argnums=(0, 1))
        state = {"params": params, "velocity": jax.tree_util.tree_map(jnp.zeros_like, params)}

        def train():
            loss, state["params"], state["velocity"] = step(state["params"], state["velocity"], x, labels)
            return loss

        return train
    f, inputs = harness.function_and_inputs(workload, primitives())
    if mode == "jit":
        f = jax.jit(f)
    return lambda: f(*inputs)


if __name__ == "__main__":
    harness.main("jax", configure, make_call, lambda result: jax.block_until_ready(result))
