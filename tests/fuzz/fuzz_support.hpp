// What the fuzz targets share: a reader that turns the fuzzer's bytes into choices, a scratch
// file per process for the readers that take paths, and the rule for exceptions: xgrad's own
// (ValueError, ShapeError and its TraceError, AutogradError) with a message are clean refusals;
// anything else that escapes, std::bad_alloc included, is a finding and aborts the run.
#pragma once

#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <new>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include <xgrad/core/error.hpp>

namespace xgrad::fuzz {

/// Reports a finding on stderr and aborts, so libFuzzer records the input as a crash.
[[noreturn]] inline void finding(std::string_view what, std::string_view detail = {}) {
  std::fprintf(stderr, "\n=== xgrad fuzz finding: %.*s\n", static_cast<int>(what.size()), what.data());
  if (!detail.empty()) std::fprintf(stderr, "    %.*s\n", static_cast<int>(detail.size()), detail.data());
  std::fflush(stderr);
  std::abort();
}

/// Runs f; returns true when it finished, false when it refused the input with one of xgrad's
/// exceptions. Any other exception is a finding: bad input must become an xgrad exception
/// (an allocation that cannot succeed a ValueError, not a bare std::bad_alloc).
template <class F> bool refuses_cleanly(F&& f) {
  auto check_message = [](const std::exception& e) {
    if (e.what() == nullptr || e.what()[0] == '\0') finding("an xgrad exception with an empty message");
  };
  try {
    f();
    return true;
  } catch (const ValueError& e) {
    check_message(e);
  } catch (const ShapeError& e) {
    check_message(e);
  } catch (const AutogradError& e) {
    check_message(e);
  } catch (const std::bad_alloc& e) {
    finding("std::bad_alloc escaped (an allocation failure must become xgrad::ValueError)", e.what());
  } catch (const std::exception& e) {
    finding(std::string("a non-xgrad exception escaped: ") + typeid(e).name(), e.what());
  } catch (...) {
    finding("something that is not a std::exception was thrown");
  }
  return false;
}

/// The fuzzer's bytes as a stream of choices; past the end every read gives zeros, so every
/// input, however short, is a complete program.
class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : m_data(data), m_size(size) {}

  std::size_t left() const { return m_size - m_pos; }
  bool empty() const { return m_pos >= m_size; }

  std::uint8_t u8() { return m_pos < m_size ? m_data[m_pos++] : 0; }
  std::uint16_t u16() { return static_cast<std::uint16_t>(u8() | (u8() << 8)); }
  std::uint32_t u32() {
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= std::uint32_t{u8()} << (8 * i);
    return v;
  }
  std::uint64_t u64() { return std::uint64_t{u32()} | (std::uint64_t{u32()} << 32); }
  bool flag() { return u8() & 1; }
  /// One of the first n choices.
  std::size_t pick(std::size_t n) { return n ? u8() % n : 0; }
  /// The next n bytes (fewer at the end).
  std::vector<std::uint8_t> take(std::size_t n) {
    n = std::min(n, left());
    std::vector<std::uint8_t> out(m_data + m_pos, m_data + m_pos + n);
    m_pos += n;
    return out;
  }
  std::vector<std::uint8_t> rest() { return take(left()); }

 private:
  const std::uint8_t* m_data;
  std::size_t m_size;
  std::size_t m_pos = 0;
};

/// A scratch directory of this process (under $TMPDIR or /tmp), removed at exit.
class ScratchDir {
 public:
  ScratchDir() {
    const char* base = std::getenv("TMPDIR");
    m_path = std::filesystem::path(base && *base ? base : "/tmp") /
             ("xgrad-fuzz-" + std::to_string(static_cast<long long>(::getpid())));
    std::filesystem::create_directories(m_path);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(m_path, ec);
  }
  std::string file(const std::string& name) const { return (m_path / name).string(); }
  const std::filesystem::path& path() const { return m_path; }

 private:
  std::filesystem::path m_path;
};

inline const ScratchDir& scratch() {
  static ScratchDir dir;
  return dir;
}

/// Writes bytes to path, replacing it.
inline void write_file(const std::string& path, const std::uint8_t* data, std::size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) finding("cannot write the scratch file", path);
  if (size && std::fwrite(data, 1, size, f) != size) finding("cannot write the scratch file", path);
  std::fclose(f);
}
inline void write_file(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  write_file(path, bytes.data(), bytes.size());
}

/// One gzip member (zlib, gzip wrapper) holding `n` bytes at `p`.
inline std::vector<std::uint8_t> gzip_member(const std::uint8_t* p, std::size_t n, int level = 9) {
  z_stream z{};
  if (deflateInit2(&z, level, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    finding("deflateInit2 failed");
  std::vector<std::uint8_t> out(deflateBound(&z, static_cast<uLong>(n)) + 32);
  z.next_in = const_cast<Bytef*>(p);
  z.avail_in = static_cast<uInt>(n);
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) finding("deflate did not finish");
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}
inline std::vector<std::uint8_t> gzip_member(const std::vector<std::uint8_t>& bytes, int level = 9) {
  return gzip_member(bytes.data(), bytes.size(), level);
}

/// An IDX file: magic 00 00 <type> <rank>, big-endian uint32 dims, then `payload` as given.
inline std::vector<std::uint8_t> idx_file(std::uint8_t type, const std::vector<std::uint32_t>& dims,
                                          const std::vector<std::uint8_t>& payload) {
  std::vector<std::uint8_t> out{0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (std::uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(d >> shift));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

/// Seed corpus generation: when $XGRAD_FUZZ_WRITE_SEEDS names a directory, a target's
/// LLVMFuzzerInitialize calls write(dir) to write its seeds there and the process exits.
/// (tests/fuzz/corpus/<target>/ holds what this wrote; docs/FUZZING.md.)
template <class Write> void write_seeds_if_asked(Write&& write) {
  const char* dir = std::getenv("XGRAD_FUZZ_WRITE_SEEDS");
  if (!dir || !*dir) return;
  std::filesystem::create_directories(dir);
  write(std::string(dir));
  std::exit(0);
}

/// Writes one seed file, dir/name.
inline void write_seed(const std::string& dir, const std::string& name, const std::vector<std::uint8_t>& bytes) {
  write_file((std::filesystem::path(dir) / name).string(), bytes);
}

}  // namespace xgrad::fuzz
