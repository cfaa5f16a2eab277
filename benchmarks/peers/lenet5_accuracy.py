"""Fashion-MNIST test accuracy of the seed notebook's LeNet5 recipe, in MindSpore or PyTorch.

Why it exists: the README's main job (examples/lenet5_fashion_mnist.cpp) states a test-accuracy
target after 3 epochs; this script measures what the recipe it copies reaches in MindSpore itself,
the seed notebook's framework, and in PyTorch, so that the target can be checked against them.

The recipe (the seed notebook): images resized bilinearly from 28x28 to 32x32 (as uint8, like
vision.Resize on the decoded image), divided by 255, normalized by 0.1307 and 0.3081, NCHW;
batches of 32 with the remainder dropped; LeNet5 with valid 5x5 convolutions without bias (the
framework's default initialization), ReLU, 2x2 max pooling and dense layers 400-120-84-10 whose
weights are drawn from N(0, 0.02^2); mean sparse softmax cross-entropy; momentum SGD, learning
rate 0.01, momentum 0.9. The data are shuffled each epoch by numpy's RNG seeded by --seed, which
also seeds the framework's initialization.

  python lenet5_accuracy.py --framework mindspore|pytorch [--data DIR] [--epochs 3] [--seed N]
                            [--mode graph|pynative] [--threads 1]
"""

import argparse
import gzip
import os
import time

import numpy as np


def read_idx(directory, name, header):
    with gzip.open(os.path.join(directory, name + ".gz"), "rb") as file:
        return np.frombuffer(file.read(), np.uint8, offset=header)


def load(directory, split):
    """(uint8 [N, 28, 28] images, int32 [N] labels) of "train" or "t10k"."""
    images = read_idx(directory, f"{split}-images-idx3-ubyte", 16).reshape(-1, 28, 28)
    labels = read_idx(directory, f"{split}-labels-idx1-ubyte", 8).astype(np.int32)
    return images, labels


def normalize(resized):
    """uint8 [N, 32, 32] -> float32 [N, 1, 32, 32]: Rescale(1/255), Normalize, HWC2CHW."""
    return ((resized.astype(np.float32) / 255.0 - 0.1307) / 0.3081)[:, None].astype(np.float32)


def batches(count, rng, batch=32):
    order = rng.permutation(count)
    for start in range(0, count - batch + 1, batch):  # drop_remainder=True
        yield order[start:start + batch]


# ---------------------------------------------------------------- MindSpore

def mindspore_run(args, train, test):
    import mindspore_peer  # PyNative on the CPU; graph mode: mindspore.jit below

    version = mindspore_peer.configure(args.threads)
    import mindspore as ms
    from mindspore.common.initializer import Normal
    from mindspore.dataset import vision

    ms.set_seed(args.seed)
    print(f"mindspore {version}, mode {args.mode}")

    resize = vision.Resize(32)  # Inter.LINEAR, on the uint8 image like the notebook's pipeline

    def prepare(images):
        return normalize(np.stack([resize(image[:, :, None]).reshape(32, 32) for image in images]))

    x_train, x_test = prepare(train[0]), prepare(test[0])

    net = mindspore_peer.lenet5(dense_weights=Normal(0.02))
    train_step = mindspore_peer.seed_train_step(net)

    def predict(data):
        return net(data).argmax(1)

    if args.mode == "graph":
        train_step, predict = ms.jit(train_step), ms.jit(predict)

    rng = np.random.default_rng(args.seed)
    for epoch in range(args.epochs):
        net.set_train(True)
        start, losses = time.perf_counter(), []
        for idx in batches(len(x_train), rng):
            loss = train_step(ms.Tensor(x_train[idx]), ms.Tensor(train[1][idx]))
            losses.append(float(loss.asnumpy()))
        report_epoch(epoch, losses, time.perf_counter() - start)

    net.set_train(False)
    correct = sum(int((predict(ms.Tensor(x_test[i:i + 1000])).asnumpy() == test[1][i:i + 1000]).sum())
                  for i in range(0, len(x_test), 1000))
    return correct / len(x_test)


# ---------------------------------------------------------------- PyTorch

def pytorch_run(args, train, test):
    import pytorch_peer

    version = pytorch_peer.configure(args.threads)
    import torch
    from torch import nn

    torch.manual_seed(args.seed)
    print(f"torch {version}, eager")

    def prepare(images):  # bilinear with half-pixel centres (OpenCV's INTER_LINEAR), back to uint8
        x = torch.from_numpy(images.astype(np.float32))[:, None]
        resized = nn.functional.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False)
        return torch.from_numpy(normalize(resized[:, 0].round().clamp(0, 255).to(torch.uint8).numpy()))

    x_train, x_test = prepare(train[0]), prepare(test[0])
    y_train, y_test = torch.from_numpy(train[1]).long(), torch.from_numpy(test[1]).long()

    net = pytorch_peer.lenet5(dense_std=0.02)  # the biases keep PyTorch's default
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    rng = np.random.default_rng(args.seed)
    for epoch in range(args.epochs):
        net.train()
        start, losses = time.perf_counter(), []
        for idx in batches(len(x_train), rng):
            idx = torch.from_numpy(idx)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(net(x_train[idx]), y_train[idx])
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        report_epoch(epoch, losses, time.perf_counter() - start)

    net.eval()
    with torch.no_grad():
        correct = sum(int((net(x_test[i:i + 1000]).argmax(1) == y_test[i:i + 1000]).sum())
                      for i in range(0, len(x_test), 1000))
    return correct / len(x_test)


def report_epoch(epoch, losses, seconds):
    print(f"epoch {epoch + 1}: mean loss {np.mean(losses):.4f} over {len(losses)} steps, {seconds:.1f} s",
          flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--framework", choices=("mindspore", "pytorch"), required=True)
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph", help="MindSpore only")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    train, test = load(args.data, "train"), load(args.data, "t10k")
    run = mindspore_run if args.framework == "mindspore" else pytorch_run
    accuracy = run(args, train, test)
    print(f"test accuracy: {100 * accuracy:.2f}%")


if __name__ == "__main__":
    main()
