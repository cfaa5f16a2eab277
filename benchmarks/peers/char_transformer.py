"""The char_transformer example's model and recipe in PyTorch: held-out loss and step time.

Why it exists: examples/char_transformer.cpp trains a small decoder-only transformer on Debian's
fortunes and prints its held-out loss after a number of steps and its step time; this script
trains the same model with the same recipe in PyTorch, eagerly and with torch.compile, so that
both can be set side by side (docs/BENCHMARKS.md, "Sequence models").

The same as the example: the corpus (the regular files of the directory in name order, links and
*.dat skipped), its byte vocabulary, windows of --context characters every --context characters
with every tenth held out (the same windows), batches of --batch windows shuffled each epoch
(numpy's generator seeded with seed + epoch: another order than the example's, the same
distribution); token and learned position embeddings N(0, 0.02^2), --layers pre-norm causal
TransformerEncoderLayers (GELU, feed-forward 4 x width, no dropout; PyTorch's initialization,
which xgrad's layers copy), a final LayerNorm and a linear head; mean cross-entropy; AdamW
(weight decay 0.01) with a linear warmup over the first tenth of the steps and a cosine down to
a tenth of --lr; gradients clipped to global norm 1. The held-out loss is the mean over the first
8 x --batch held-out windows, as the example's.

  python char_transformer.py [--data DIR] [--steps 400] [--compile] [--threads N] [--seed N]
"""

import argparse
import math
import os
import time

import numpy as np
import torch


def read_corpus(path):
    if not os.path.isdir(path):
        with open(path, "rb") as file:
            return file.read()
    names = sorted(n for n in os.listdir(path)
                   if not n.endswith(".dat") and not os.path.islink(os.path.join(path, n))
                   and os.path.isfile(os.path.join(path, n)))
    text = b""
    for name in names:
        with open(os.path.join(path, name), "rb") as file:
            text += file.read()
    return text


def windows(length, context, held_out=0.1):
    """(train starts, held-out starts): xgrad's TextDataset split."""
    train, test = [], []
    for w in range((length - 1) // context):
        held = math.floor((w + 1) * held_out) > math.floor(w * held_out)
        (test if held else train).append(w * context)
    return np.array(train), np.array(test)


def batch_of(ids, starts, context):
    index = starts[:, None] + np.arange(context + 1)[None, :]
    chunk = torch.from_numpy(ids[index].astype(np.int64))
    return chunk[:, :-1], chunk[:, 1:]


class CharTransformer(torch.nn.Module):
    def __init__(self, vocab, context, width, heads, layers):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, width)
        self.positions = torch.nn.Embedding(context, width)
        torch.nn.init.normal_(self.tokens.weight, std=0.02)
        torch.nn.init.normal_(self.positions.weight, std=0.02)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu",
                                             batch_first=True, norm_first=True) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(context))

    def forward(self, ids):
        t = ids.shape[1]
        x = self.tokens(ids) + self.positions(torch.arange(t, device=ids.device))
        for block in self.blocks:
            x = block(x, src_mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.norm(x))


def train_step(model, optimizer):
    """The recipe's step on a batch: mean cross-entropy, backward, clipping to norm 1, the update."""
    def step(inputs, targets):
        loss = torch.nn.functional.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss

    return step


def learning_rate(step, base, steps):
    """xgrad's optim::warmup_cosine(base, steps / 10, steps, base / 10)."""
    warmup, low = steps // 10, base / 10
    if step < warmup:
        return base * (step + 1) / warmup
    if step >= steps:
        return low
    return low + (base - low) * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (steps - warmup)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="/usr/share/games/fortunes")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--compile", action="store_true", help="torch.compile the train step")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    text = np.frombuffer(read_corpus(args.data), np.uint8)
    chars = np.unique(text)
    lookup = np.zeros(256, np.int64)
    lookup[chars] = np.arange(len(chars))
    ids = lookup[text]
    train, test = windows(len(ids), args.context)
    print(f"{args.data}: {len(ids)} characters, a vocabulary of {len(chars)}, {len(train)} training and "
          f"{len(test)} held-out windows")

    model = CharTransformer(len(chars), args.context, args.width, args.heads, args.layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    step = train_step(model, optimizer)
    run = torch.compile(step) if args.compile else step
    done, untimed, timed_from, start = 0, 3, None, time.perf_counter()
    epoch = 0
    while done < args.steps:
        order = np.random.default_rng(args.seed + epoch).permutation(train)
        for first in range(0, len(order) - args.batch + 1, args.batch):
            if done == args.steps:
                break
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(done, args.lr, args.steps)
            loss = run(*batch_of(ids, order[first:first + args.batch], args.context)).item()
            done += 1
            if done == untimed:
                timed_from = time.perf_counter()
            if done % 50 == 0 or done == args.steps:
                print(f"  step {done:4d}  loss {loss:.3f}  {time.perf_counter() - start:.1f} s")
        epoch += 1
    per_step = (time.perf_counter() - timed_from) / (done - untimed)

    with torch.no_grad():
        held = test[:8 * args.batch]
        total = 0.0
        for first in range(0, len(held), args.batch):
            inputs, targets = batch_of(ids, held[first:first + args.batch], args.context)
            total += torch.nn.functional.cross_entropy(model(inputs).flatten(0, 1), targets.flatten()).item() * len(inputs)
        loss = total / len(held)
    mode = "torch.compile" if args.compile else "eager"
    print(f"PyTorch {torch.__version__} {mode}, {torch.get_num_threads()} threads: {done} steps, "
          f"{1e3 * per_step:.1f} ms a step; held-out loss {loss:.4f} nats, {loss / math.log(2):.3f} bits per character")


if __name__ == "__main__":
    main()
