// The process group and the collectives. The suite runs these cases twice: in the test program
// as a group of one, and under `mpirun -np 2` (ctest's xgrad_distributed_mpi, with XGRAD_MPI=ON),
// where each rank checks its result against the definition computed from every rank's input.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace xg = xgrad;
namespace dist = xgrad::distributed;
using xgrad::testing::contains;
using xgrad::testing::message_of;

namespace {

/// Rank r's input element i: distinct across ranks and elements (no ties for max and min), and
/// exact in every dtype.
template <class T> T value(int r, std::int64_t i) {
  if constexpr (std::is_same_v<T, bool>)
    return (i + r) % 3 == 0;
  else
    return static_cast<T>(((i * 7 + r * 5) % 23) - 11) * T(2) + static_cast<T>(r);
}

template <class T> xg::Tensor<T> input(const xg::Shape& shape, int r) {
  std::vector<T> v(static_cast<std::size_t>(shape.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = value<T>(r, static_cast<std::int64_t>(i));
  return xg::tensor(v, shape);
}

/// What all_reduce gives at element i.
template <class T> T reduced(dist::ReduceOp op, int n, std::int64_t i) {
  T acc = value<T>(0, i);
  for (int r = 1; r < n; ++r) {
    const T v = value<T>(r, i);
    acc = op == dist::ReduceOp::max ? std::max(acc, v) : op == dist::ReduceOp::min ? std::min(acc, v) : acc + v;
  }
  if (op == dist::ReduceOp::mean) acc /= static_cast<T>(n);
  return acc;
}

const std::vector<xg::Shape> kShapes = {xg::Shape{}, xg::Shape{5}, xg::Shape{3, 4}, xg::Shape{2, 3, 2}};

void join() {
  dist::init();
  REQUIRE(dist::is_initialized());
}

template <class T> void check_all_reduce(bool compiled) {
  const int n = dist::world_size(), me = dist::rank();
  std::vector<dist::ReduceOp> ops{dist::ReduceOp::sum, dist::ReduceOp::max, dist::ReduceOp::min};
  if constexpr (xg::FloatingPoint<T>) ops.push_back(dist::ReduceOp::mean);
  for (const xg::Shape& shape : kShapes)
    for (dist::ReduceOp op : ops) {
      CAPTURE(shape);
      CAPTURE(dist::reduce_op_name(op));
      auto f = [op](const xg::Tensor<T>& x) { return dist::all_reduce(x, op); };
      const xg::Tensor<T> y = compiled ? xg::jit(f)(input<T>(shape, me)) : f(input<T>(shape, me));
      REQUIRE(y.shape() == shape);
      const std::vector<T> got = y.to_vector();
      for (std::int64_t i = 0; i < shape.numel(); ++i) CHECK(got[i] == reduced<T>(op, n, i));
    }
}

template <class T> void check_gather_scatter_broadcast(bool compiled) {
  const int n = dist::world_size(), me = dist::rank();
  for (const xg::Shape& shape : kShapes) {
    CAPTURE(shape);
    auto gather = [](const xg::Tensor<T>& x) { return dist::all_gather(x); };
    const xg::Tensor<T> g = compiled ? xg::jit(gather)(input<T>(shape, me)) : gather(input<T>(shape, me));
    xg::Shape stacked{n};
    for (std::int64_t d : shape) stacked.push_back(d);
    REQUIRE(g.shape() == stacked);
    const std::vector<T> all = g.to_vector();
    for (int r = 0; r < n; ++r)
      for (std::int64_t i = 0; i < shape.numel(); ++i) CHECK(all[r * shape.numel() + i] == value<T>(r, i));

    for (int root = 0; root < n; ++root) {
      auto bcast = [root](const xg::Tensor<T>& x) { return dist::broadcast(x, root); };
      const std::vector<T> b =
          (compiled ? xg::jit(bcast)(input<T>(shape, me)) : bcast(input<T>(shape, me))).to_vector();
      for (std::int64_t i = 0; i < shape.numel(); ++i) CHECK(b[i] == value<T>(root, i));
    }

    if constexpr (!std::is_same_v<T, bool>) {
      // Rank r passes its inputs stacked n times, slice s scaled by s + 1: slice `me` of the
      // sum is (me + 1) times the ranks' sum.
      auto scatter = [n](const xg::Tensor<T>& x) {
        std::vector<xg::Tensor<T>> slices;
        for (int s = 0; s < n; ++s) slices.push_back(x * static_cast<T>(s + 1));
        return dist::reduce_scatter(xg::stack(slices, 0));
      };
      const xg::Tensor<T> y = compiled ? xg::jit(scatter)(input<T>(shape, me)) : scatter(input<T>(shape, me));
      REQUIRE(y.shape() == shape);
      const std::vector<T> got = y.to_vector();
      for (std::int64_t i = 0; i < shape.numel(); ++i)
        CHECK(got[i] == static_cast<T>(me + 1) * reduced<T>(dist::ReduceOp::sum, n, i));
    }
  }
}

}  // namespace

TEST_CASE("distributed: before init(), the group's functions say to call it") {
  REQUIRE_FALSE(dist::is_initialized());  // the first case of this file: nothing has joined yet
  const std::string what = message_of<xg::DistributedError>([] { (void)dist::rank(); });
  CHECK(contains(what, "distributed::rank"));
  CHECK(contains(what, "init()"));
  CHECK(contains(message_of<xg::DistributedError>([] { (void)dist::all_reduce(xg::ones<float>({2})); }), "all_reduce"));
  // A timeout that is no duration is refused before anything starts.
  CHECK(contains(message_of<xg::DistributedError>([] { dist::init({.timeout = std::chrono::milliseconds(0)}); }),
                 "timeout must be positive, got 0 ms"));
  ::setenv("XGRAD_DISTRIBUTED_TIMEOUT", "soon", 1);
  const std::string bad_env = message_of<xg::DistributedError>([] { dist::init(); });
  ::unsetenv("XGRAD_DISTRIBUTED_TIMEOUT");
  CHECK(contains(bad_env, "XGRAD_DISTRIBUTED_TIMEOUT must be a positive number of seconds, got 'soon'"));
  CHECK_FALSE(dist::is_initialized());
  if constexpr (!dist::built_with_mpi()) {
    // mpirun's environment, without MPI in this build: init() says how to get it.
    ::setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    const std::string refused = message_of<xg::DistributedError>([] { dist::init(); });
    ::unsetenv("OMPI_COMM_WORLD_SIZE");
    CHECK(contains(refused, "-DXGRAD_MPI=ON"));
    CHECK(contains(refused, "one of 4"));
    CHECK_FALSE(dist::is_initialized());
  }
}

TEST_CASE("distributed: init() joins the group mpirun started, or a group of one") {
  join();
  dist::init();  // a second call does nothing
  const char* launched = std::getenv("OMPI_COMM_WORLD_SIZE");
  CHECK(dist::world_size() == (launched ? std::atoi(launched) : 1));
  CHECK(dist::rank() >= 0);
  CHECK(dist::rank() < dist::world_size());
  dist::barrier();
}

TEST_CASE("distributed: all_reduce gives the definition on every rank, eagerly and compiled") {
  join();
  for (bool compiled : {false, true}) {
    CAPTURE(compiled);
    check_all_reduce<float>(compiled);
    check_all_reduce<double>(compiled);
    check_all_reduce<std::int32_t>(compiled);
    check_all_reduce<std::int64_t>(compiled);
  }
}

TEST_CASE("distributed: all_gather, broadcast and reduce_scatter give the definition, eagerly and compiled") {
  join();
  for (bool compiled : {false, true}) {
    CAPTURE(compiled);
    check_gather_scatter_broadcast<float>(compiled);
    check_gather_scatter_broadcast<double>(compiled);
    check_gather_scatter_broadcast<std::int32_t>(compiled);
    check_gather_scatter_broadcast<std::int64_t>(compiled);
    check_gather_scatter_broadcast<bool>(compiled);
  }
}

TEST_CASE("distributed: stats() counts the collectives, their bytes and the time spent on them") {
  join();
  const dist::Stats before = dist::stats();
  (void)dist::all_reduce(xg::ones<float>({256}));
  (void)dist::all_gather(xg::ones<double>({8}));
  dist::barrier();
  const dist::Stats after = dist::stats();
  if (dist::world_size() == 1) {
    CHECK(after.collectives == before.collectives);  // a group of one sends nothing
    CHECK(after.bytes == before.bytes);
  } else {
    CHECK(after.collectives == before.collectives + 3);
    CHECK(after.bytes == before.bytes + 256 * 4 + 8 * 8);
    CHECK(after.seconds > before.seconds);
  }
}

TEST_CASE("distributed: the collectives stay in the compiled graph, in order, even when nothing reads them") {
  join();
  auto f = [](const xg::Tensor<float>& x) {
    (void)dist::all_reduce(x * 2.0f);  // unused, but every rank must still send it
    return dist::all_reduce(x, dist::ReduceOp::max) + dist::all_reduce(x, dist::ReduceOp::max);
  };
  const std::string ir = xg::jit(f).lower(xg::ones<float>({3})).ir();
  CHECK(contains(ir, "AllReduce"));
  std::size_t count = 0;
  for (std::size_t at = ir.find("AllReduce"); at != std::string::npos; at = ir.find("AllReduce", at + 1)) ++count;
  CHECK(count == 3);  // not removed as dead, not merged as common subexpressions
  const std::vector<float> y = xg::jit(f)(xg::ones<float>({3})).to_vector();
  CHECK(y == std::vector<float>(3, 2.0f));
}

TEST_CASE("distributed: gradients through the collectives match central differences of the ranks' total loss") {
  join();
  const int n = dist::world_size(), me = dist::rank();
  using T = xg::Tensor<double>;
  // Each rank's loss weighs the collective's output by its own weights; the function
  // differentiated is the sum of the ranks' losses, as data-parallel training's is.
  const T w = input<double>({2, 3}, me + 3) * 0.25;
  const std::vector<std::pair<std::string, std::function<T(const T&)>>> cases = {
      {"all_reduce sum", [](const T& x) { return dist::all_reduce(x); }},
      {"all_reduce mean", [](const T& x) { return dist::all_reduce(x, dist::ReduceOp::mean); }},
      {"all_reduce max", [](const T& x) { return dist::all_reduce(x, dist::ReduceOp::max); }},
      {"all_reduce min", [](const T& x) { return dist::all_reduce(x, dist::ReduceOp::min); }},
      {"all_gather", [](const T& x) { return xg::sum(dist::all_gather(x), {0}); }},
      {"broadcast", [](const T& x) { return dist::broadcast(x, 0); }},
      {"reduce_scatter sum", [n](const T& x) { return dist::reduce_scatter(xg::stack(std::vector<T>(n, x * x), 0)); }},
      {"reduce_scatter mean",
       [n](const T& x) { return dist::reduce_scatter(xg::stack(std::vector<T>(n, x * x), 0), dist::ReduceOp::mean); }},
      {"reduce_scatter max",
       [n](const T& x) {
         return dist::reduce_scatter(xg::stack(std::vector<T>(n, x * x * x), 0), dist::ReduceOp::max);
       }},
  };
  for (const auto& named : cases) {
    const std::string& name = named.first;
    CAPTURE(name);
    auto local_loss = [&, collective = named.second](const T& x) { return xg::sum(collective(x) * w); };
    auto total = [&](const T& x) { return dist::all_reduce(local_loss(x)).item(); };
    const T x = input<double>({2, 3}, me) * 0.5;
    for (bool compiled : {false, true}) {
      CAPTURE(compiled);
      const T g = compiled ? xg::grad(xg::jit(local_loss))(x) : xg::grad(local_loss)(x);
      const std::vector<double> analytic = g.to_vector();
      // Rank s moves its element j; every rank evaluates the total loss in the same order.
      const double h = 1e-4;
      for (int s = 0; s < n; ++s)
        for (std::int64_t j = 0; j < x.numel(); ++j) {
          auto moved = [&](double by) {
            std::vector<double> v = x.to_vector();
            if (s == me) v[j] += by;
            return xg::tensor(v, x.shape());
          };
          const double numeric = (total(moved(h)) - total(moved(-h))) / (2 * h);
          if (s == me) CHECK(analytic[j] == doctest::Approx(numeric).epsilon(1e-6));
        }
    }
  }
}

TEST_CASE("distributed: forward mode through the collectives agrees with reverse mode over the ranks") {
  // With every rank's tangent v and cotangent u, the sums over the ranks of <u, J v> (jvp) and
  // of <J^T u, v> (vjp) are the same number, for each collective, eagerly and compiled.
  join();
  const int n = dist::world_size(), me = dist::rank();
  using T = xg::Tensor<double>;
  const std::vector<std::pair<std::string, std::function<T(const T&)>>> cases = {
      {"all_reduce sum", [](const T& x) { return dist::all_reduce(x * x); }},
      {"all_reduce mean", [](const T& x) { return dist::all_reduce(x * x, dist::ReduceOp::mean); }},
      {"all_reduce max", [](const T& x) { return dist::all_reduce(x, dist::ReduceOp::max); }},
      {"all_gather", [](const T& x) { return dist::all_gather(x * x); }},
      {"broadcast", [n](const T& x) { return dist::broadcast(x * x, n - 1); }},
      {"reduce_scatter sum", [n](const T& x) { return dist::reduce_scatter(xg::stack(std::vector<T>(n, x * x), 0)); }},
      {"reduce_scatter max",
       [n](const T& x) {
         return dist::reduce_scatter(xg::stack(std::vector<T>(n, x * x * x), 0), dist::ReduceOp::max);
       }},
  };
  const T x = input<double>({2, 3}, me) * 0.5, v = input<double>({2, 3}, me + 7) * 0.25;
  for (const auto& named : cases) {
    const std::string& name = named.first;
    const auto& f = named.second;
    CAPTURE(name);
    for (bool compiled : {false, true}) {
      CAPTURE(compiled);
      auto tangent = [&f](const T& a, const T& t) { return xg::jvp(f, a, t).second; };
      const T jv = compiled ? xg::jit(tangent)(x, v) : tangent(x, v);
      const T u = input<double>(jv.shape(), me + 11) * 0.125;
      const T jtu = std::get<0>(xg::vjp(f, x).second(u));
      const double forward = dist::all_reduce(xg::sum(u * jv)).item();
      const double reverse = dist::all_reduce(xg::sum(jtu * v)).item();
      CHECK(forward == doctest::Approx(reverse).epsilon(1e-12));
    }
  }
}

TEST_CASE("distributed: vmap over the collectives exchanges the whole batch, as a loop of them would") {
  join();
  const std::int64_t n = dist::world_size(), me = dist::rank(), batch = 3;
  const auto xs = input<double>(xg::Shape{batch, n, 2}, static_cast<int>(me));  // reduce_scatter wants [n, ...]
  const auto row = [](const xg::Tensor<double>& t, std::int64_t b) {
    std::vector<std::int64_t> begin(static_cast<std::size_t>(t.ndim()), 0), size = t.shape().to_vector();
    begin[0] = b;
    size[0] = 1;
    return xg::reshape(xg::slice(t, begin, size), std::vector<std::int64_t>(size.begin() + 1, size.end()));
  };
  const std::vector<std::pair<std::string, std::function<xg::Tensor<double>(const xg::Tensor<double>&)>>> collectives{
      {"all_reduce sum", [](const xg::Tensor<double>& x) { return dist::all_reduce(x); }},
      {"all_reduce max", [](const xg::Tensor<double>& x) { return dist::all_reduce(x, dist::ReduceOp::max); }},
      {"all_gather", [](const xg::Tensor<double>& x) { return dist::all_gather(x); }},
      {"reduce_scatter mean",
       [](const xg::Tensor<double>& x) { return dist::reduce_scatter(x, dist::ReduceOp::mean); }},
      {"broadcast", [](const xg::Tensor<double>& x) { return dist::broadcast(x, 0); }},
  };
  for (const auto& named : collectives) {
    CAPTURE(named.first);
    const auto& f = named.second;
    const auto mapped = xg::vmap(f)(xs);
    const auto compiled = xg::jit(xg::vmap(f))(xs);
    REQUIRE(mapped.shape()[0] == batch);
    for (std::int64_t b = 0; b < batch; ++b) {
      const auto expected = f(row(xs, b)).to_vector();
      CHECK(row(mapped, b).to_vector() == expected);
      CHECK(row(compiled, b).to_vector() == expected);
    }
  }
  // Per-example gradients through a collective: the gradient of each value's loss.
  const auto w = input<double>(xg::Shape{2}, 0);
  auto loss = [](const xg::Tensor<double>& v, const xg::Tensor<double>& x) {
    return xg::sum(dist::all_reduce(x * v) * v);
  };
  const auto per_example = xg::vmap(xg::grad(loss), xg::in_axes{xg::none, 0})(w, xs);
  for (std::int64_t b = 0; b < batch; ++b)
    CHECK(row(per_example, b).to_vector() == xg::grad(loss)(w, row(xs, b)).to_vector());
}

TEST_CASE("distributed: the errors say what is wrong") {
  join();
  CHECK(contains(
      message_of<xg::ValueError>([] { (void)dist::all_reduce(xg::ones<std::int32_t>({2}), dist::ReduceOp::mean); }),
      "mean of an Int32 tensor"));
  const std::string scatter = message_of<xg::ShapeError>([] { (void)dist::reduce_scatter(xg::ones<float>({7, 2})); });
  CHECK(contains(scatter, "reduce_scatter"));
  CHECK(contains(scatter, "leading axis"));
  CHECK(contains(message_of<xg::ValueError>([] { (void)dist::broadcast(xg::ones<float>({2}), 99); }), "root 99"));
  if (dist::world_size() > 1) {
    // Rank 1 passes another shape: every rank learns who disagrees, instead of hanging.
    const xg::Shape shape = dist::rank() == 1 ? xg::Shape{3} : xg::Shape{2, 2};
    const std::string what = message_of<xg::DistributedError>([&] { (void)dist::all_reduce(xg::ones<float>(shape)); });
    CHECK(contains(what, "the ranks disagree"));
    CHECK(contains(what, "all_reduce (sum) of Float32[3]"));
    CHECK(contains(what, "all_reduce (sum) of Float32[2, 2]"));
    CHECK(contains(what, "rank 0 calls collective #"));
    CHECK(contains(what, "rank 1 calls collective #"));
    CHECK(contains(what, "test_distributed.cpp"));
    // A rank exchanging a tensor on the device (NCCL) while another sends it through the host
    // (MPI) would never meet it: the records differ.
    float v = 1;
    const dist::detail::Signature sig{.op = "all_reduce",
                                      .dtype = xg::DType::float32,
                                      .shape = xg::Shape{1},
                                      .loc = xg::SourceLoc::current(),
                                      .on_device = dist::rank() == 1};
    const std::string mixed =
        message_of<xg::DistributedError>([&] { dist::detail::all_reduce(&v, 1, dist::ReduceOp::sum, sig); });
    CHECK(contains(mixed, "the ranks disagree"));
    CHECK(contains(mixed, "all_reduce (sum) of Float32[1] on the device (NCCL)"));
  }
}

namespace {

/// Every element of the network's parameters, in order, as raw bits.
std::vector<float> flat_parameters(const xg::nn::Module& net) {
  std::vector<float> out;
  for (const auto& p : net.parameters()) {
    const std::vector<float> v = p.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

/// True when every rank holds the same bits as this one.
bool same_on_every_rank(const std::vector<float>& mine) {
  const std::vector<float> all = dist::all_gather(xg::tensor(mine)).to_vector();
  for (std::size_t r = 0; r < all.size() / mine.size(); ++r)
    if (std::memcmp(all.data() + r * mine.size(), mine.data(), mine.size() * sizeof(float)) != 0) return false;
  return true;
}

}  // namespace

TEST_CASE("distributed: data-parallel LeNet5 on n ranks with batch 32/n follows one process with batch 32") {
  join();
  const int n = dist::world_size(), me = dist::rank();
  REQUIRE(32 % n == 0);
  const xg::Mode saved_mode = xg::get_mode();
  // 320 random images, 10 batches of 32 an epoch, shuffled: 100 steps are 10 epochs.
  const auto images = xg::randn<float>({320, 1, 32, 32}, 5);
  std::vector<std::int32_t> classes(320);
  for (std::size_t i = 0; i < classes.size(); ++i) classes[i] = static_cast<std::int32_t>((i * 7 + i / 3) % 10);
  const auto labels = xg::tensor(classes);
  const auto data = xg::data::TensorDataset(images, labels).shuffle(8);
  for (xg::Mode mode : {xg::Mode::graph, xg::Mode::eager}) {
    CAPTURE(mode == xg::Mode::graph);
    xg::set_mode(mode);
    const int steps = mode == xg::Mode::graph ? 100 : 20;
    xg::init::set_seed(3);
    xg::models::LeNet5 whole_net, replica;
    // The replicas start from rank 1's own initialization where there is one: the Model must
    // replace it with rank 0's.
    xg::init::set_seed(3 + static_cast<std::uint64_t>(me));
    xg::models::LeNet5 own_init;
    {
      xg::no_grad writing_parameters;
      for (std::size_t i = 0; i < replica.parameters().size(); ++i)
        xg::Tensor<float>(replica.parameters()[i]).assign(own_init.parameters()[i]);
    }
    xg::nn::SoftmaxCrossEntropy loss({.sparse = true, .reduction = xg::Reduction::mean});
    xg::optim::Momentum whole_opt(whole_net.parameters(), 0.01f, 0.9f), replica_opt(replica.parameters(), 0.01f, 0.9f);
    xg::Model whole(whole_net, loss, whole_opt);
    xg::Model parallel(replica, loss, replica_opt, {}, {.data_parallel = true, .bucket_bytes = 64 << 10});
    const auto whole_batches = data.batch(32).prefetch(0);
    const auto my_batches = data.shard(me, n).batch(32 / n).prefetch(0);
    int step = 0;
    for (int epoch = 0; step < steps; ++epoch) {
      auto mine = my_batches.epoch(epoch).begin();
      for (const auto& batch : whole_batches.epoch(epoch)) {
        if (step++ == steps) break;
        const float reference = whole.train_step(batch.images, batch.labels);
        const float got = parallel.train_step((*mine).images, (*mine).labels);
        ++mine;
        CAPTURE(step);
        CHECK(got == doctest::Approx(reference).epsilon(1e-5));
        REQUIRE(same_on_every_rank(flat_parameters(replica)));
      }
    }
  }
  xg::set_mode(saved_mode);
}

TEST_CASE("distributed: data-parallel training checks that every rank has as many batches") {
  join();
  if (dist::world_size() == 1) {
    CHECK(dist::all_reduce_bucketed(std::vector<xg::Tensor<float>>{xg::ones<float>({2})})[0].to_vector() ==
          std::vector<float>{1.0f, 1.0f});
    return;
  }
  xg::init::set_seed(3);
  xg::models::LeNet5 net;
  xg::nn::SoftmaxCrossEntropy loss({.sparse = true, .reduction = xg::Reduction::mean});
  xg::optim::Momentum opt(net.parameters(), 0.01f, 0.9f);
  xg::Model model(net, loss, opt, {}, {.data_parallel = true});
  // 5 samples in batches of 2: rank 0's shard has 3 (2 batches), rank 1's 2 (1 batch).
  const auto data = xg::data::TensorDataset(xg::zeros<float>({5, 1, 32, 32}), xg::zeros<std::int32_t>({5}))
                        .shard(dist::rank(), dist::world_size())
                        .batch(2);
  const std::string what = message_of<xg::ValueError>([&] { model.train(1, data); });
  CHECK(contains(what, "same number of batches per epoch"));
  CHECK(contains(what, "rank 0 has 2"));
  CHECK(contains(what, "drop_remainder"));
}

namespace {

/// Counts the steps it sees, and asks to stop after `stop_after` on rank `rank` (-1: never).
struct StopAt : xg::callbacks::Callback {
  StopAt(int rank, std::int64_t stop_after) : rank(rank), stop_after(stop_after) {}
  int rank;
  std::int64_t stop_after, steps = 0;
  void on_step_end(const xg::callbacks::RunContext& ctx) override {
    ++steps;
    if (dist::rank() == rank && ctx.step == stop_after) ctx.stop_training = true;
  }
};

}  // namespace

TEST_CASE("distributed: data-parallel Model: rank 0 prints, a stop on any rank stops all, metrics count every rank") {
  join();
  const int n = dist::world_size(), me = dist::rank();
  const xg::Mode saved_mode = xg::get_mode();
  xg::set_mode(xg::Mode::eager);
  const auto images = xg::randn<float>({64, 1, 32, 32}, 9);
  std::vector<std::int32_t> classes(64);
  for (std::size_t i = 0; i < classes.size(); ++i) classes[i] = static_cast<std::int32_t>(i % 10);
  const auto data = xg::data::TensorDataset(images, xg::tensor(classes)).prefetch(0);
  xg::init::set_seed(3);
  xg::models::LeNet5 net;
  xg::nn::SoftmaxCrossEntropy loss({.sparse = true, .reduction = xg::Reduction::mean});
  xg::optim::Momentum opt(net.parameters(), 0.01f, 0.9f);
  xg::Model model(net, loss, opt, {{"Accuracy", xg::metrics::accuracy()}}, {.data_parallel = true});
  std::ostringstream printed;
  xg::callbacks::LossMonitor monitor(1, printed);
  StopAt stop(n - 1, 3);
  model.train(2, data.shard(me, n).batch(16 / n, true), {std::ref(monitor), std::ref(stop)});
  CHECK(stop.steps == 3);  // the last rank asked; every rank stopped there
  CHECK(printed.str().empty() == (me != 0));
  // Accuracy over the ranks' shards is accuracy over the whole set, as one process sees it.
  const double sharded = model.eval(data.shard(me, n).batch(8))["Accuracy"];
  xg::Model local(net, loss, opt, {{"Accuracy", xg::metrics::accuracy()}});
  CHECK(sharded == local.eval(data.batch(8))["Accuracy"]);
  xg::set_mode(saved_mode);
}

TEST_CASE("distributed: all_reduce_start and wait give all_reduce's result, with work in between") {
  join();
  const int n = dist::world_size(), me = dist::rank();
  const xg::Shape shape{3, 5};
  auto split = [](const xg::Tensor<double>& x) {
    const auto started = dist::all_reduce_start(x, dist::ReduceOp::mean);
    const auto meanwhile = xg::sum(xg::exp(x));  // runs while the exchange does
    return dist::wait(started) + meanwhile * 0.0;
  };
  for (bool compiled : {false, true}) {
    CAPTURE(compiled);
    const auto x = input<double>(shape, me);
    const std::vector<double> got = (compiled ? xg::jit(split)(x) : split(x)).to_vector();
    for (std::int64_t i = 0; i < shape.numel(); ++i) CHECK(got[i] == reduced<double>(dist::ReduceOp::mean, n, i));
  }
  const std::string ir = xg::jit(split).lower(input<double>(shape, me)).ir();
  const auto start = ir.find("AllReduceStart"), wait = ir.find("CollectiveWait"), exp = ir.find("Exp");
  REQUIRE(start != std::string::npos);
  REQUIRE(wait != std::string::npos);
  CHECK(start < wait);
  CHECK((exp > start && exp < wait));  // the work in between stays in between
  CHECK(contains(message_of<xg::DistributedError>([] { (void)dist::wait(xg::ones<float>({2})); }),
                 "no started collective is in flight on this tensor"));
}

TEST_CASE("distributed: a data-parallel step starts reducing its first gradients before its backward pass ends") {
  join();
  const xg::Mode saved_mode = xg::get_mode();
  xg::set_mode(xg::Mode::graph);
  xg::init::set_seed(3);
  xg::models::LeNet5 net;
  xg::nn::SoftmaxCrossEntropy loss({.sparse = true, .reduction = xg::Reduction::mean});
  xg::optim::Momentum opt(net.parameters(), 0.01f, 0.9f);
  xg::Model model(net, loss, opt, {}, {.data_parallel = true, .bucket_bytes = 64 << 10});
  const auto images = xg::randn<float>({4, 1, 32, 32}, 1);
  const auto labels = xg::tensor<std::int32_t>({1, 2, 3, 4});
  const std::string ir = model.lower_train_step(images, labels).ir();
  // LeNet5's 247 KB of gradients in buckets of at most 64 KiB, packed from the last parameter:
  // fc3, fc2 and fc1's bias (44.5 KB); fc1's weight alone (192 KB, larger than a bucket); the
  // convolutions' weights (10.2 KB).
  std::vector<std::size_t> starts, waits;
  for (auto at = ir.find("AllReduceStart"); at != std::string::npos; at = ir.find("AllReduceStart", at + 1))
    starts.push_back(at);
  for (auto at = ir.find("CollectiveWait"); at != std::string::npos; at = ir.find("CollectiveWait", at + 1))
    waits.push_back(at);
  if (dist::world_size() == 1) {  // nothing to average: the step is the single process's
    CHECK(starts.empty());
    CHECK(waits.empty());
    xg::set_mode(saved_mode);
    return;
  }
  CHECK(starts.size() == 3);
  CHECK(waits.size() == 3);
  REQUIRE_FALSE(starts.empty());
  // The first bucket (fc3, the last layer) starts while conv1's and conv2's gradients are still
  // to come: a convolution's backward follows it in the graph.
  CHECK(ir.find("Conv2D", starts.front()) < waits.front());
  xg::set_mode(saved_mode);
}

namespace {

/// Each collective's start form, waited for, against the collective itself (whose results the
/// cases above check against their definitions), eagerly and compiled.
template <class T> void check_started_forms() {
  const int n = dist::world_size(), me = dist::rank();
  for (const xg::Shape& shape : kShapes) {
    CAPTURE(shape);
    const auto x = input<T>(shape, me);
    for (bool compiled : {false, true}) {
      CAPTURE(compiled);
      auto run = [compiled](auto f, const xg::Tensor<T>& in) {
        return (compiled ? xg::jit(f)(in) : f(in)).to_vector();
      };
      CHECK(run([](const xg::Tensor<T>& a) { return dist::wait(dist::all_gather_start(a)); }, x) ==
            dist::all_gather(x).to_vector());
      for (int root = 0; root < n; ++root)
        CHECK(run([root](const xg::Tensor<T>& a) { return dist::wait(dist::broadcast_start(a, root)); }, x) ==
              dist::broadcast(x, root).to_vector());
      if constexpr (!std::is_same_v<T, bool>) {
        CHECK(run([](const xg::Tensor<T>& a) { return dist::wait(dist::all_reduce_start(a, dist::ReduceOp::max)); },
                  x) == dist::all_reduce(x, dist::ReduceOp::max).to_vector());
        const auto stacked = xg::stack(std::vector<xg::Tensor<T>>(n, x), 0);
        CHECK(run([](const xg::Tensor<T>& a) { return dist::wait(dist::reduce_scatter_start(a)); }, stacked) ==
              dist::reduce_scatter(stacked).to_vector());
      }
    }
  }
}

}  // namespace

TEST_CASE("distributed: every collective's start form, waited for, gives the collective's result") {
  join();
  check_started_forms<float>();
  check_started_forms<std::int32_t>();
  check_started_forms<bool>();
  // Several in flight at once finish in the order they were started.
  const auto a = dist::all_reduce_start(xg::ones<float>({4}));
  const auto b = dist::all_gather_start(xg::full<float>({2}, 3.0f));
  CHECK(dist::wait(b).to_vector() == std::vector<float>(2 * dist::world_size(), 3.0f));
  CHECK(dist::wait(a).to_vector() == std::vector<float>(4, static_cast<float>(dist::world_size())));
}

#if defined(XGRAD_WITH_THRUST)

namespace {

/// Every collective and its start form on Device::thrust tensors against the same on the cpu
/// (which the cases above check against the definitions), eagerly and compiled: through NCCL
/// where it exchanges device tensors (a CUDA build with MPI, on several GPUs), else through the host.
template <class T> void check_on_device() {
  const int n = dist::world_size(), me = dist::rank();
  using Fn = std::function<xg::Tensor<T>(const xg::Tensor<T>&)>;
  std::vector<std::pair<std::string, Fn>> collectives{
      {"all_gather", [](const xg::Tensor<T>& a) { return dist::all_gather(a); }},
      {"all_gather_start", [](const xg::Tensor<T>& a) { return dist::wait(dist::all_gather_start(a)); }},
      {"broadcast", [n](const xg::Tensor<T>& a) { return dist::broadcast(a, n - 1); }},
      {"broadcast_start", [n](const xg::Tensor<T>& a) { return dist::wait(dist::broadcast_start(a, n - 1)); }}};
  if constexpr (!std::is_same_v<T, bool>) {
    std::vector<dist::ReduceOp> ops{dist::ReduceOp::sum, dist::ReduceOp::max};
    if constexpr (xg::FloatingPoint<T>) ops.push_back(dist::ReduceOp::mean);
    for (dist::ReduceOp op : ops) {
      const std::string name(dist::reduce_op_name(op));
      collectives.emplace_back("all_reduce " + name, [op](const xg::Tensor<T>& a) { return dist::all_reduce(a, op); });
      collectives.emplace_back("all_reduce_start " + name,
                               [op](const xg::Tensor<T>& a) { return dist::wait(dist::all_reduce_start(a, op)); });
      collectives.emplace_back("reduce_scatter " + name, [op, n](const xg::Tensor<T>& a) {
        return dist::reduce_scatter(xg::stack(std::vector<xg::Tensor<T>>(n, a), 0), op);
      });
      collectives.emplace_back("reduce_scatter_start " + name, [op, n](const xg::Tensor<T>& a) {
        return dist::wait(dist::reduce_scatter_start(xg::stack(std::vector<xg::Tensor<T>>(n, a), 0), op));
      });
    }
  }
  for (const xg::Shape& shape : kShapes) {
    CAPTURE(shape);
    const xg::Tensor<T> x = input<T>(shape, me);
    for (const auto& named : collectives) {
      const std::string& name = named.first;  // not a structured binding: clang 14 cannot capture one
      const Fn& f = named.second;
      CAPTURE(name);
      const std::vector<T> want = f(x).to_vector();
      for (bool compiled : {false, true}) {
        CAPTURE(compiled);
        const xg::Tensor<T> on_device = x.to(xg::Device::thrust);
        const xg::Tensor<T> got = compiled ? xg::jit(f)(on_device) : f(on_device);
        CHECK(got.device() == xg::Device::thrust);
        CHECK(got.to_vector() == want);
      }
    }
  }
}

}  // namespace

TEST_CASE("distributed: the collectives on Device::thrust give the cpu's results, eagerly and compiled") {
  join();
  check_on_device<float>();
  check_on_device<double>();
  check_on_device<std::int32_t>();
  check_on_device<bool>();
  const int last = dist::world_size() - 1;
  xg::Tensor<float> t = input<float>({3, 4}, dist::rank()).to(xg::Device::thrust);
  dist::broadcast_into(t, last);
  CHECK(t.to_vector() == input<float>({3, 4}, last).to_vector());
  if (dist::world_size() == 1) CHECK_FALSE(dist::detail::exchanges_on_device());
}

#endif
