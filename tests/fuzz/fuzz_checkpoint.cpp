// Fuzz target: the checkpoint reader (nn/checkpoint.hpp): load_checkpoint into a module, into a
// module and an Adam optimizer, and load_tensors. Every input must either load or throw
// xgrad::ValueError, and a refused load must leave the module and the optimizer bitwise as they
// were (checkpoints load all or nothing). Loaded tensors must have the shape the module gave
// them, and load_tensors' tensors must be usable (read and summed).
//
// Input: [flags] [file...]; flags bit 0: repair the CRCs first (fix_checksums) so that the
// fuzzer's changes reach the checks behind them; bits 1-2: 0 load_checkpoint(module),
// 1 load_checkpoint(module, optimizer), 2 load_tensors.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <xgrad/nn/checkpoint.hpp>
#include <xgrad/xgrad.hpp>

#include "checkpoint_fixture.hpp"
#include "fuzz_support.hpp"

namespace xf = xgrad::fuzz;
namespace xg = xgrad;

namespace {

using State = std::vector<std::pair<std::string, xg::TensorBase>>;

struct Snapshot {
  std::vector<xg::Shape> shapes;
  std::vector<std::vector<unsigned char>> bytes;
};
Snapshot snapshot(const State& state) {
  Snapshot s;
  for (const auto& [name, t] : state) {
    s.shapes.push_back(t.shape());
    const auto* p = static_cast<const unsigned char*>(t.impl()->storage->data());
    s.bytes.emplace_back(p, p + static_cast<std::size_t>(t.numel()) * xg::dtype_size(t.dtype()));
  }
  return s;
}
bool same(const Snapshot& a, const Snapshot& b) {
  if (a.shapes.size() != b.shapes.size()) return false;
  for (std::size_t i = 0; i < a.shapes.size(); ++i)
    if (!(a.shapes[i] == b.shapes[i]) || a.bytes[i] != b.bytes[i]) return false;
  return true;
}

void use(const xg::TensorBase& t) {
  switch (t.dtype()) {
    case xg::DType::float32:
      (void)xg::sum(xg::Tensor<float>(t)).item();
      break;
    case xg::DType::float64:
      (void)xg::sum(xg::Tensor<double>(t)).item();
      break;
    case xg::DType::int32:
      (void)xg::sum(xg::Tensor<std::int32_t>(t)).item();
      break;
    case xg::DType::int64:
      (void)xg::sum(xg::Tensor<std::int64_t>(t)).item();
      break;
    case xg::DType::boolean:
      for (bool b : xg::Tensor<bool>(t).to_vector())
        if (static_cast<unsigned char>(b) > 1) xf::finding("load_tensors gave a Bool element that is not 0 or 1");
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  xf::write_seeds_if_asked([](const std::string& dir) {
    xf::CkptNet net;
    auto opt = xf::stepped_adam(net);
    const std::string path = xf::scratch().file("seed.ckpt");
    auto seed = [&](std::uint8_t flags) {
      std::FILE* f = std::fopen(path.c_str(), "rb");
      std::vector<std::uint8_t> bytes{flags};
      for (int c; (c = std::fgetc(f)) != EOF;) bytes.push_back(static_cast<std::uint8_t>(c));
      std::fclose(f);
      return bytes;
    };
    xg::save_checkpoint(net, path);
    xf::write_seed(dir, "module", seed(0));
    xf::write_seed(dir, "module_load_tensors", seed(4 | 1));
    xg::save_checkpoint(net, *opt, path);
    xf::write_seed(dir, "module_and_adam", seed(2));
    xf::write_seed(dir, "module_and_adam_fixed_crc", seed(2 | 1));
    xg::save_tensors(path, {{"model/x", xg::tensor<double>({1.0, 2.0})}, {"b", xg::zeros<bool>({2, 0, 2})}});
    xf::write_seed(dir, "tensors", seed(4 | 1));
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t flags = data[0];
  std::vector<std::uint8_t> file(data + 1, data + size);
  if (flags & 1) xf::fix_checksums(file);
  const std::string path = xf::scratch().file("input.ckpt");
  xf::write_file(path, file);

  static xf::CkptNet net;
  static auto opt = xf::stepped_adam(net);
  const int what = (flags >> 1) % 3;
  const Snapshot net_before = snapshot(net.named_state());
  const Snapshot opt_before = snapshot(opt->named_state());
  const bool loaded = xf::refuses_cleanly([&] {
    if (what == 0) {
      xg::load_checkpoint(net, path);
    } else if (what == 1) {
      xg::load_checkpoint(net, *opt, path);
    } else {
      for (const auto& [name, t] : xg::load_tensors(path)) {
        if (name.empty()) xf::finding("load_tensors gave a tensor with an empty name");
        use(t);
      }
    }
  });
  const Snapshot net_after = snapshot(net.named_state());
  const Snapshot opt_after = snapshot(opt->named_state());
  if (net_after.shapes != net_before.shapes || opt_after.shapes != opt_before.shapes)
    xf::finding("a load changed the shape of a module's or optimizer's tensor");
  if (!loaded && (!same(net_before, net_after) || !same(opt_before, opt_after)))
    xf::finding("a refused load changed the module or the optimizer (loads must be all or nothing)");
  if (loaded && what == 0 && !same(opt_before, opt_after)) xf::finding("load_checkpoint(module) changed the optimizer");
  return 0;
}
