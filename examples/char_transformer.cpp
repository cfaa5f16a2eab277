// A character-level language model on real English text: a small decoder-only transformer
// (xg::models::CharTransformer: token and learned position embeddings, causal
// TransformerEncoderLayers, a final LayerNorm and a linear head) trained on Debian's fortunes, eagerly and then with
// the whole train step compiled (graph mode) from the same initial weights. Each run prints its step time and its loss
// and bits per character on held-out text; then the eager / graph step-time ratio and a sample the graph-trained model
// writes, a character at a time through a cache of past keys and values.
//
//   char_transformer [--data PATH] [--steps N] [--seconds S] [--layers N] [--heads N] [--width N]
//                    [--context N] [--batch N] [--lr X] [--mode eager|graph|both] [--sample N]
//                    [--temperature X] [--top-k N] [--threads N] [--seed N]
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>
#include <xgrad/backend/cpu/thread_pool.hpp>
#include <xgrad/data/text.hpp>
#include <xgrad/xgrad.hpp>

#include "flags.hpp"

namespace xg = xgrad;
using xg::Tensor;

namespace {

struct Options {
  std::string data = "/usr/share/games/fortunes";
  std::int64_t steps = 400;  // per mode
  double seconds = 0;        // per mode, 0: no limit
  std::int64_t layers = 4, heads = 4, width = 128, context = 128, batch = 32;
  float lr = 3e-3f;  // the peak of a warmup-then-cosine schedule
  std::string mode = "both";
  std::int64_t sample = 300;  // characters to generate
  float temperature = 0.8f;
  std::int64_t top_k = 20;
  int threads = 0;  // 0: the library's default
  std::uint64_t seed = 1;
};

Options parse(int argc, char** argv) {
  const xg::examples::Flags flags("char_transformer",
                                  "[--data PATH] [--steps N] [--seconds S] [--layers N] [--heads N] [--width N] "
                                  "[--context N] [--batch N] [--lr X] [--mode eager|graph|both] [--sample N] "
                                  "[--temperature X] [--top-k N] [--threads N] [--seed N]");
  Options o;
  auto number = [&](const std::string& flag, const std::string& value) {
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' || !(v >= 0)) flags.fail(flag + " takes a number >= 0, got '" + value + "'");
    return v;
  };
  flags.parse(argc, argv, [&](const std::string& flag, const std::string& value) {
    if (flag == "--data")
      o.data = value;
    else if (flag == "--steps")
      o.steps = flags.positive(flag, value);
    else if (flag == "--seconds")
      o.seconds = number(flag, value);
    else if (flag == "--layers")
      o.layers = flags.positive(flag, value);
    else if (flag == "--heads")
      o.heads = flags.positive(flag, value);
    else if (flag == "--width")
      o.width = flags.positive(flag, value);
    else if (flag == "--context")
      o.context = flags.positive(flag, value);
    else if (flag == "--batch")
      o.batch = flags.positive(flag, value);
    else if (flag == "--lr")
      o.lr = static_cast<float>(number(flag, value));
    else if (flag == "--mode" && (value == "eager" || value == "graph" || value == "both"))
      o.mode = value;
    else if (flag == "--sample")
      o.sample = static_cast<std::int64_t>(number(flag, value));
    else if (flag == "--temperature")
      o.temperature = static_cast<float>(number(flag, value));
    else if (flag == "--top-k")
      o.top_k = static_cast<std::int64_t>(number(flag, value));
    else if (flag == "--threads")
      o.threads = static_cast<int>(flags.positive(flag, value));
    else if (flag == "--seed")
      o.seed = static_cast<std::uint64_t>(flags.positive(flag, value));
    else
      return false;
    return true;
  });
  if (o.width % o.heads != 0) flags.fail("--width must be a multiple of --heads");
  return o;
}

struct RunResult {
  std::unique_ptr<xg::models::CharTransformer> model;
  std::int64_t steps = 0;
  double seconds_per_step = 0;  // after the first (compiling) steps
  double held_out_loss = 0;
};

/// Mean loss over the first `windows` held-out windows, in batches.
double held_out_loss(xg::models::CharTransformer& model, const xg::data::TextDataset& text, std::int64_t batch) {
  xg::no_grad off;
  const std::int64_t windows = std::min<std::int64_t>(text.windows(xg::data::Split::test), 8 * batch);
  double total = 0;
  for (std::int64_t first = 0; first < windows; first += batch) {
    const auto b = text.batch(xg::data::Split::test, first, std::min(batch, windows - first));
    total += model.loss(b.inputs, b.targets).item() * static_cast<double>(b.inputs.shape()[0]);
  }
  return total / static_cast<double>(windows);
}

RunResult train(const Options& o, const xg::data::TextDataset& text, bool graph) {
  RunResult r;
  xg::init::set_seed(o.seed);  // the same initial weights in both modes
  r.model = std::make_unique<xg::models::CharTransformer>(
      xg::models::CharTransformerOptions{.vocab = text.vocabulary().size(),
                                         .context = o.context,
                                         .width = o.width,
                                         .heads = o.heads,
                                         .layers = o.layers,
                                         .dropout = 0.0f});
  xg::models::CharTransformer& model = *r.model;
  const auto params = model.parameters();
  xg::optim::AdamW optimizer(params, o.lr, {.weight_decay = 0.01f});
  const auto schedule = xg::optim::warmup_cosine(o.lr, o.steps / 10, o.steps, o.lr / 10);
  // One train step, the same code in both modes: forward, backward, clipping, the update.
  auto step = [&](const Tensor<std::int32_t>& inputs, const Tensor<std::int32_t>& targets) {
    auto [loss, grads] = xg::value_and_grad([&] { return model.loss(inputs, targets); }, params)();
    optimizer.step(xg::optim::clip_by_global_norm(grads, 1.0f).grads);
    return loss;
  };
  auto compiled = xg::jit(step, {.name = "char_transformer_step"});
  std::printf("%s: %lld parameters in %zu tensors, %lld steps of %lld windows of %lld characters\n",
              graph ? "graph mode (the whole step compiled)" : "eager mode (op by op)", static_cast<long long>([&] {
                std::int64_t n = 0;
                for (const auto& p : params) n += p.numel();
                return n;
              }()),
              params.size(), static_cast<long long>(o.steps), static_cast<long long>(o.batch),
              static_cast<long long>(o.context));
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto timed_from = start;
  const std::int64_t untimed = 3;  // the first steps compile (graph) or warm the caches
  double running = 0;
  for (std::int64_t epoch = 0; r.steps < o.steps; ++epoch) {
    for (const auto& batch : text.batches(xg::data::Split::train, o.batch, o.seed, epoch)) {
      if (r.steps == o.steps) break;
      if (batch.inputs.shape()[0] != o.batch) continue;  // one batch shape: one compiled step
      optimizer.set_learning_rate(schedule(r.steps));
      const float loss = (graph ? compiled(batch.inputs, batch.targets) : step(batch.inputs, batch.targets)).item();
      running = r.steps == 0 ? loss : 0.95 * running + 0.05 * loss;
      if (++r.steps == untimed) timed_from = Clock::now();
      if (r.steps % 50 == 0 || r.steps == o.steps)
        std::printf("  step %4lld  loss %.3f (running mean)  %.1f s\n", static_cast<long long>(r.steps), running,
                    std::chrono::duration<double>(Clock::now() - start).count());
      if (o.seconds > 0 && std::chrono::duration<double>(Clock::now() - start).count() > o.seconds) break;
    }
    if (o.seconds > 0 && std::chrono::duration<double>(Clock::now() - start).count() > o.seconds) break;
  }
  if (r.steps > untimed)
    r.seconds_per_step =
        std::chrono::duration<double>(Clock::now() - timed_from).count() / static_cast<double>(r.steps - untimed);
  r.held_out_loss = held_out_loss(model, text, o.batch);
  std::printf("  %lld steps, %.1f ms a step; held-out loss %.4f nats, %.3f bits per character\n",
              static_cast<long long>(r.steps), 1e3 * r.seconds_per_step, r.held_out_loss,
              r.held_out_loss / std::log(2.0));
  return r;
}

/// `count` characters after `prompt`, a character at a time: each new position attends over
/// the cached keys and values of the ones before (recomputed from the last half of the context
/// when it fills up), so a character costs one position's work, not the whole sequence's.
std::string generate(xg::models::CharTransformer& model, const xg::data::Vocabulary& vocab, const std::string& prompt,
                     const Options& o) {
  xg::no_grad off;
  model.set_train(false);
  std::mt19937_64 generator(o.seed);
  std::vector<std::int32_t> ids = vocab.encode(prompt);
  std::vector<xg::nn::KeyValueCache> caches;
  std::int32_t cached = 0;  // positions the caches hold
  Tensor<float> last;       // the logits of the newest position
  for (std::int64_t produced = 0; produced <= o.sample; ++produced) {
    if (cached == 0 || cached == o.context) {  // (re)fill the caches from the text so far
      const auto keep =
          static_cast<std::int64_t>(std::min<std::size_t>(ids.size(), static_cast<std::size_t>(o.context / 2)));
      caches.assign(model.blocks.size(), {});
      const std::vector<std::int32_t> window(ids.end() - keep, ids.end());
      const auto logits = model.logits(xg::tensor<std::int32_t>(window, {1, keep}), 0, &caches);
      last = xg::slice(logits, {keep - 1, 0}, {1, logits.shape()[1]});
      cached = static_cast<std::int32_t>(keep);
    } else {
      last = model.logits(xg::tensor<std::int32_t>({ids.back()}, {1, 1}), cached++, &caches);
    }
    if (produced == o.sample) break;
    ids.push_back(xg::nn::sample(last, {.temperature = o.temperature, .top_k = o.top_k}, generator).item());
  }
  return vocab.decode(ids);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (o.threads > 0) xg::cpu::set_num_threads(o.threads);
  const xg::data::TextDataset text(o.data, {.context = o.context});
  std::printf("%s: %lld characters, a vocabulary of %lld, %lld training and %lld held-out windows\n", o.data.c_str(),
              static_cast<long long>(text.characters()), static_cast<long long>(text.vocabulary().size()),
              static_cast<long long>(text.windows(xg::data::Split::train)),
              static_cast<long long>(text.windows(xg::data::Split::test)));
  RunResult eager, graph;
  if (o.mode != "graph") eager = train(o, text, false);
  if (o.mode != "eager") graph = train(o, text, true);
  if (eager.model && graph.model && graph.seconds_per_step > 0)
    std::printf("graph mode is %.2fx faster a step than eager (%.1f vs %.1f ms); held-out loss %.4f vs %.4f\n",
                eager.seconds_per_step / graph.seconds_per_step, 1e3 * graph.seconds_per_step,
                1e3 * eager.seconds_per_step, graph.held_out_loss, eager.held_out_loss);
  xg::models::CharTransformer& model = graph.model ? *graph.model : *eager.model;
  std::printf("--- a sample (temperature %.2f, top-k %lld) ---\n%s\n", o.temperature, static_cast<long long>(o.top_k),
              generate(model, text.vocabulary(), "\n", o).c_str());
}
