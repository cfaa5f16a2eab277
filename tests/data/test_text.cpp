// TextDataset: the corpus it reads (a file, or a directory's text files in name order), its
// vocabulary, the windows and their train / held-out split, shuffled batches, the errors; then
// Debian's fortunes, the corpus the char_transformer example trains on.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <xgrad/data.hpp>

#include "test_support.hpp"

namespace xg = xgrad;
using namespace xgrad::testing;  // TempDir, message_of, contains
using xg::data::Split;

namespace {

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::string alphabet(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back(static_cast<char>('a' + i % 26));
  return s;
}

}  // namespace

TEST_CASE("text: the vocabulary is the text's bytes in order, and encodes and decodes") {
  const xg::data::Vocabulary vocab("hello, world");
  CHECK(vocab.size() == 9);  // " ,dehlorw"
  const auto ids = vocab.encode("world");
  CHECK(ids == std::vector<std::int32_t>{8, 6, 7, 5, 2});
  CHECK(vocab.decode(ids) == "world");
  CHECK(contains(message_of<xg::ValueError>([&] { vocab.encode("hi"); }), "character 105 (byte value) at position 1"));
  const std::vector<std::int32_t> bad{0, 9};
  CHECK(contains(message_of<xg::ValueError>([&] { vocab.decode(bad); }), "id 9 at position 1 is outside [0, 9)"));
}

TEST_CASE("text: windows, targets one character on, a held-out share spread evenly, shuffled batches") {
  TempDir dir;
  const std::string text = alphabet(1001);
  write_text(dir.file("corpus.txt"), text);
  xg::data::TextDataset data(dir.file("corpus.txt"), {.context = 10, .held_out = 0.25});
  CHECK(data.characters() == 1001);
  CHECK(data.vocabulary().size() == 26);
  CHECK(data.context() == 10);
  // 100 windows of 10 (+1 for the last target); every fourth held out.
  CHECK(data.windows(Split::train) == 75);
  CHECK(data.windows(Split::test) == 25);
  const auto held = data.batch(Split::test, 0, 2);
  CHECK(held.inputs.shape() == xg::Shape{2, 10});
  // Window 3 (characters 30..39) is the first held out, window 7 the second.
  CHECK(data.vocabulary().decode(held.inputs.to_vector()) == text.substr(30, 10) + text.substr(70, 10));
  CHECK(data.vocabulary().decode(held.targets.to_vector()) == text.substr(31, 10) + text.substr(71, 10));

  const auto epoch = data.batches(Split::train, 8, 42, 0);
  CHECK(epoch.size() == 10);  // 75 windows: nine of 8, one of 3
  std::multiset<std::string> seen;
  std::int64_t batches = 0;
  for (const auto& b : epoch) {
    ++batches;
    const auto n = b.inputs.shape()[0];
    CHECK(n == (batches < 10 ? 8 : 3));
    const auto in = data.vocabulary().decode(b.inputs.to_vector()),
               out = data.vocabulary().decode(b.targets.to_vector());
    for (std::int64_t r = 0; r < n; ++r) {
      const auto window = in.substr(static_cast<std::size_t>(r * 10), 10);
      CHECK(out.substr(static_cast<std::size_t>(r * 10), 9) == window.substr(1));  // shifted by one
      seen.insert(window);
    }
  }
  CHECK(batches == 10);
  CHECK(seen.size() == 75);  // each training window once
  // The same seed and epoch give the same order; another epoch another.
  auto first_window = [&](std::uint64_t seed, std::int64_t e) {
    return data.batches(Split::train, 8, seed, e).at(0).inputs.to_vector();
  };
  CHECK(first_window(42, 0) == first_window(42, 0));
  CHECK(first_window(42, 0) != first_window(42, 1));
}

TEST_CASE("text: a directory is its text files in name order; links and fortune's .dat indexes are skipped") {
  TempDir dir;
  write_text(dir.file("b"), "BBBB");
  write_text(dir.file("a"), "AAAA");
  write_text(dir.file("a.dat"), std::string("\x00\x01\x02", 3));
  std::filesystem::create_symlink("a", dir.file("a.u8"));
  xg::data::TextDataset data(dir.path, {.context = 3, .held_out = 0.0});
  CHECK(data.characters() == 8);
  CHECK(data.vocabulary().decode(data.batch(Split::train, 0, 2).inputs.to_vector()) == "AAAABB");
  CHECK(data.windows(Split::test) == 0);
}

TEST_CASE("text: bad paths, short texts and bad options are refused, naming them") {
  TempDir dir;
  write_text(dir.file("short"), "abc");
  CHECK(contains(message_of<xg::ValueError>([&] { xg::data::TextDataset(dir.file("missing")); }),
                 "is neither a file nor a directory"));
  CHECK(contains(message_of<xg::ValueError>([&] { xg::data::TextDataset(dir.file("short"), {.context = 3}); }),
                 "holds 3 characters, fewer than one window of context + 1 = 4"));
  CHECK(contains(message_of<xg::ValueError>([&] { xg::data::TextDataset(dir.file("short"), {.context = 0}); }),
                 "context must be >= 1"));
  CHECK(contains(
      message_of<xg::ValueError>([&] { xg::data::TextDataset(dir.file("short"), {.context = 1, .held_out = 1.0}); }),
      "held_out must be in [0, 1)"));
  const xg::data::TextDataset data(dir.file("short"), {.context = 1, .held_out = 0.0});
  CHECK(contains(message_of<xg::ValueError>([&] { data.batches(Split::train, 0, 1); }), "batch_size must be >= 1"));
  CHECK(contains(message_of<xg::ValueError>([&] { data.batch(Split::train, 1, 2); }), "outside the split's 2"));
}

TEST_CASE("text: Debian's fortunes, the example's corpus") {
  // scripts/test.sh installs the fortunes package.
  const xg::data::TextDataset data("/usr/share/games/fortunes", {.context = 128});
  CHECK(data.characters() > 2'000'000);
  CHECK(data.vocabulary().size() > 90);  // printable ASCII, tabs, newlines, backspaces
  CHECK(data.vocabulary().size() <= 256);
  const auto windows = data.windows(Split::train) + data.windows(Split::test);
  CHECK(windows == (data.characters() - 1) / 128);
  CHECK(data.windows(Split::test) == windows / 10);
  const auto text = data.vocabulary().decode(data.batch(Split::train, 0, 4).inputs.to_vector());
  CHECK(text.size() == 512);
}
