// Definitions of nn/checkpoint.hpp: included by it when header-only, compiled once into the
// library (src/nn.cpp) otherwise.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <ios>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "xgrad/core/dtype.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/shape.hpp"
#include "xgrad/nn/checkpoint.hpp"

namespace xgrad {

namespace detail::ckpt {

// Payloads are the storage bytes as they are; a big-endian host would need a byte swap.
static_assert(std::endian::native == std::endian::little, "xgrad checkpoints assume a little-endian host");
static_assert(sizeof(bool) == 1, "Bool payloads are one byte per element");

inline constexpr std::array<unsigned char, 8> kMagic{'X', 'G', 'C', 'K', 'P', 'T', 0, 0};
inline constexpr std::uint32_t kVersion = 1;
inline constexpr std::string_view kModelSection = "model/";
inline constexpr std::string_view kOptimizerSection = "optimizer/";
// name length, a one-byte name, dtype, rank, payload length, checksum: bounds the tensor count.
inline constexpr std::size_t kMinRecordBytes = 4 + 1 + 1 + 1 + 8 + 4;

XGRAD_API std::uint32_t crc32(std::uint32_t crc, const unsigned char* p, std::size_t n) {
  uLong c = crc;
  while (n > 0) {
    const auto chunk = static_cast<uInt>(std::min<std::size_t>(n, std::numeric_limits<uInt>::max()));
    c = ::crc32(c, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<std::uint32_t>(c);
}

/// The file's dtype codes; fixed here rather than taken from the DType enum's order.
inline std::uint8_t dtype_code(DType d) {
  switch (d) {
    case DType::float32:
      return 1;
    case DType::float64:
      return 2;
    case DType::int32:
      return 3;
    case DType::int64:
      return 4;
    case DType::boolean:
      return 5;
  }
  return 0;
}
inline std::optional<DType> dtype_from_code(std::uint8_t code) {
  for (DType d : {DType::float32, DType::float64, DType::int32, DType::int64, DType::boolean})
    if (dtype_code(d) == code) return d;
  return std::nullopt;
}

/// Well-formed UTF-8: no overlong forms, surrogates or code points past U+10FFFF.
inline bool valid_utf8(std::string_view s) {
  static constexpr std::uint32_t kMinCodePoint[] = {0, 0, 0x80, 0x800, 0x10000};
  for (std::size_t i = 0; i < s.size();) {
    const auto lead = static_cast<unsigned char>(s[i]);
    const std::size_t len = lead < 0x80           ? 1
                            : (lead >> 5) == 0x6  ? 2
                            : (lead >> 4) == 0xE  ? 3
                            : (lead >> 3) == 0x1E ? 4
                                                  : 0;
    if (len == 0 || len > s.size() - i) return false;
    std::uint32_t cp = len == 1 ? lead : lead & (0x7Fu >> len);
    for (std::size_t k = 1; k < len; ++k) {
      const auto next = static_cast<unsigned char>(s[i + k]);
      if ((next & 0xC0) != 0x80) return false;
      cp = cp << 6 | (next & 0x3F);
    }
    if (cp < kMinCodePoint[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

inline std::string errno_text(int err) { return std::generic_category().message(err); }

inline std::string describe(const TensorBase& t) { return concat(dtype_name(t.dtype()), t.shape()); }

/// Little-endian fields appended to a byte string.
struct Encoder {
  std::vector<unsigned char> bytes;
  void u8(std::uint8_t v) { bytes.push_back(v); }
  void u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<unsigned char>(v >> (8 * i)));
  }
  void u64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<unsigned char>(v >> (8 * i)));
  }
  void raw(std::string_view s) { bytes.insert(bytes.end(), s.begin(), s.end()); }
};

/// A file that appears at `path` only once complete: written to a temporary file beside it
/// (same filesystem, so the rename is atomic), synced, then renamed over `path`. Destroyed
/// before commit(), it removes the temporary file and leaves `path` as it was.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path) : m_path(path) {
    std::random_device random;
    const std::uint64_t tag = std::uint64_t{random()} << 32 | random();
    m_temp = concat(path, ".tmp-", ::getpid(), "-", std::hex, tag);
    m_fd = ::open(m_temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (m_fd < 0) fail("cannot create the temporary file '", m_temp, "'");
    m_buffer.reserve(kBufferBytes);
  }
  ~AtomicFile() {
    if (m_fd >= 0) ::close(m_fd);
    if (!m_committed) ::unlink(m_temp.c_str());
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  /// Appends bytes, keeping the CRC-32 of everything written so far.
  void write(const unsigned char* p, std::size_t n) {
    m_crc = crc32(m_crc, p, n);
    if (m_buffer.size() + n > kBufferBytes) flush();
    if (n >= kBufferBytes)
      write_all(p, n);
    else
      m_buffer.insert(m_buffer.end(), p, p + n);
  }
  void write(const std::vector<unsigned char>& bytes) { write(bytes.data(), bytes.size()); }
  std::uint32_t crc() const { return m_crc; }

  void commit() {
    flush();
    if (::fsync(m_fd) != 0) fail("cannot sync '", m_temp, "' to disk");
    const int fd = std::exchange(m_fd, -1);
    if (::close(fd) != 0) fail("cannot close '", m_temp, "'");
    if (::rename(m_temp.c_str(), m_path.c_str()) != 0) fail("cannot rename '", m_temp, "' to it");
    m_committed = true;
    // Makes the rename itself durable. The new file is already in place, so a filesystem
    // that cannot sync directories is no reason to fail.
    auto dir = std::filesystem::path(m_path).parent_path();
    if (const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }

 private:
  static constexpr std::size_t kBufferBytes = std::size_t{1} << 20;

  template <class... Parts> [[noreturn]] void fail(const Parts&... parts) const {
    const int err = errno;
    throw ValueError(concat("cannot save checkpoint '", m_path, "': ", parts..., ": ", errno_text(err)));
  }
  void flush() {
    write_all(m_buffer.data(), m_buffer.size());
    m_buffer.clear();
  }
  void write_all(const unsigned char* p, std::size_t n) {
    while (n > 0) {
      const ssize_t done = ::write(m_fd, p, n);
      if (done < 0 && errno == EINTR) continue;
      if (done <= 0) {
        if (done == 0) errno = EIO;
        fail("cannot write '", m_temp, "'");
      }
      p += done;
      n -= static_cast<std::size_t>(done);
    }
  }

  std::string m_path, m_temp;
  int m_fd = -1;
  bool m_committed = false;
  std::uint32_t m_crc = 0;
  std::vector<unsigned char> m_buffer;
};

/// Checks what save_tensors needs of each tensor before any byte is written.
inline void check_savable(const std::string& path, const NamedTensors& tensors) {
  auto fail = [&](const auto&... parts) {
    throw ValueError(concat("cannot save checkpoint '", path, "': ", parts...));
  };
  if (tensors.size() > std::numeric_limits<std::uint32_t>::max()) fail(tensors.size(), " tensors is too many");
  std::unordered_set<std::string_view> seen;
  for (const auto& [name, t] : tensors) {
    if (name.empty()) fail("a tensor has an empty name");
    if (name.size() > std::numeric_limits<std::uint32_t>::max()) fail("the name of a tensor is too long");
    if (!valid_utf8(name)) fail("the name '", name, "' is not valid UTF-8");
    if (!seen.insert(name).second) fail("two tensors are named '", name, "'");
    if (!t.defined()) fail("tensor '", name, "' is undefined (an empty handle)");
    if (t.is_symbolic()) fail("tensor '", name, "' is a traced value without data (saved inside a jit trace?)");
    if (t.device() != Device::cpu) fail("tensor '", name, "' is on device ", device_name(t.device()), ", not cpu");
    if (t.impl()->storage->bytes() < static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype()))
      fail("tensor '", name, "' has less storage than its shape needs");
  }
}

/// One tensor as the file holds it: where its payload lies in the file's bytes.
struct Entry {
  std::size_t index;
  std::string name;
  DType dtype;
  Shape shape;
  std::size_t offset, bytes;
};

/// Reads a checkpoint's bytes, checking every field against the bytes that remain before
/// trusting it, so a truncated or corrupt file is reported, never read out of bounds.
class Parser {
 public:
  Parser(const std::string& path, const std::vector<unsigned char>& file) : m_path(path), m_file(file) {}

  std::vector<Entry> parse() {
    const unsigned char* magic = take(kMagic.size(), "the magic bytes");
    if (!std::equal(kMagic.begin(), kMagic.end(), magic)) fail("not an xgrad checkpoint (its first 8 bytes are wrong)");
    if (const std::uint32_t version = u32("the format version"); version != kVersion)
      fail("format version ", version, " is not supported (this build of xgrad reads version ", kVersion, ")");
    const std::uint32_t count = u32("the tensor count");
    if (count > remaining() / kMinRecordBytes)
      fail("the header claims ", count, " tensors, more than the ", remaining(), " remaining bytes can hold");

    std::vector<Entry> entries;
    std::unordered_map<std::string, std::uint32_t> first_index;
    for (std::uint32_t i = 0; i < count; ++i) {
      entries.push_back(record(i));
      if (auto [it, fresh] = first_index.emplace(entries.back().name, i); !fresh)
        fail("the name is already used by tensor ", it->second);
      m_where.clear();
    }
    const std::size_t end = m_pos;
    const std::uint32_t stored = u32("the file checksum");
    if (remaining() != 0) fail(remaining(), " unexpected bytes after the file checksum (at byte ", m_pos, ")");
    if (const std::uint32_t computed = crc32(0, m_file.data(), end); computed != stored)
      fail("file checksum mismatch (stored ", hex(stored), ", computed ", hex(computed), "): the file is corrupt");
    return entries;
  }

 private:
  Entry record(std::uint32_t index) {
    m_where = concat("tensor ", index, ": ");
    const std::size_t start = m_pos;
    const std::uint32_t name_bytes = u32("the name length");
    if (name_bytes == 0) fail("the name is empty");
    const auto* name = reinterpret_cast<const char*>(take(name_bytes, "the name"));
    Entry e{index, std::string(name, name_bytes), DType::float32, Shape(), 0, 0};
    m_where = concat("tensor ", index, " ('", e.name, "'): ");

    const std::uint8_t code = u8("the dtype code");
    const auto dtype = dtype_from_code(code);
    if (!dtype) fail("unknown dtype code ", int{code});
    e.dtype = *dtype;
    const std::uint8_t rank = u8("the rank");
    if (rank > kMaxRank) fail("rank ", int{rank}, " exceeds the maximum of ", kMaxRank);
    // numel is kept below what the remaining bytes can hold, so no product overflows.
    const std::size_t room = remaining();
    const std::uint64_t max_numel = room / dtype_size(e.dtype);
    std::uint64_t numel = 1;
    for (int axis = 0; axis < rank; ++axis) {
      const auto dim = static_cast<std::int64_t>(u64("a dimension"));
      if (dim < 0) fail("dimension ", axis, " is negative (", dim, ")");
      e.shape.push_back(dim);
      if (numel != 0 && static_cast<std::uint64_t>(dim) > max_numel / numel)
        fail("shape ", e.shape, "... has more elements than the ", room, " remaining bytes can hold");
      numel *= static_cast<std::uint64_t>(dim);
    }
    const std::uint64_t payload = u64("the payload length");
    if (payload != numel * dtype_size(e.dtype))
      fail("payload length ", payload, " does not match ", dtype_name(e.dtype), e.shape, " (",
           numel * dtype_size(e.dtype), " bytes)");
    e.offset = m_pos;
    e.bytes = static_cast<std::size_t>(payload);
    take(e.bytes, "the payload");

    const std::size_t end = m_pos;
    const std::uint32_t stored = u32("the tensor checksum");
    if (const std::uint32_t computed = crc32(0, m_file.data() + start, end - start); computed != stored)
      fail("checksum mismatch (stored ", hex(stored), ", computed ", hex(computed), "): the file is corrupt");
    // Checked after the checksum: a corrupt byte is reported as corruption first.
    if (!valid_utf8(e.name)) fail("the name is not valid UTF-8");
    if (e.dtype == DType::boolean)
      for (std::size_t k = 0; k < e.bytes; ++k)
        if (m_file[e.offset + k] > 1) fail("Bool element ", k, " is ", int{m_file[e.offset + k]}, ", not 0 or 1");
    return e;
  }

  std::size_t remaining() const { return m_file.size() - m_pos; }
  const unsigned char* take(std::size_t n, std::string_view what) {
    if (n > remaining())
      fail(what, " at byte ", m_pos, " needs ", n, " bytes, but only ", remaining(),
           " remain: the file is truncated or corrupt");
    const unsigned char* p = m_file.data() + m_pos;
    m_pos += n;
    return p;
  }
  std::uint8_t u8(std::string_view what) { return *take(1, what); }
  std::uint32_t u32(std::string_view what) {
    const unsigned char* p = take(4, what);
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= std::uint32_t{p[i]} << (8 * i);
    return v;
  }
  std::uint64_t u64(std::string_view what) {
    const unsigned char* p = take(8, what);
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t{p[i]} << (8 * i);
    return v;
  }
  static std::string hex(std::uint32_t v) { return concat("0x", std::hex, v); }

  template <class... Parts> [[noreturn]] void fail(const Parts&... parts) const {
    throw ValueError(concat("checkpoint '", m_path, "': ", m_where, parts...));
  }

  const std::string& m_path;
  const std::vector<unsigned char>& m_file;
  std::size_t m_pos = 0;
  std::string m_where;  // "tensor 3 ('fc1.weight'): " while reading a tensor
};

/// The whole file, read before anything is parsed.
inline std::vector<unsigned char> read_file(const std::string& path) {
  auto fail = [&](const char* what) {
    const int err = errno;
    throw ValueError(concat("checkpoint '", path, "': ", what, ": ", errno_text(err)));
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat info {};
  if (::fstat(fd, &info) != 0) fail("cannot stat");
  if (!S_ISREG(info.st_mode)) throw ValueError(concat("checkpoint '", path, "': not a regular file"));
  std::vector<unsigned char> bytes(static_cast<std::size_t>(info.st_size));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("cannot read");
    if (n == 0) break;  // shrank while being read: the parser reports it as truncated
    done += static_cast<std::size_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

/// Pairs the file's entries of one section with `state`, the tensors of `owner` ("module",
/// "Adam optimizer"); every mismatch is added to `problems`.
inline void match_section(std::string_view section, const std::string& owner, const NamedTensors& state,
                          const std::vector<Entry>& entries, std::vector<std::pair<const Entry*, TensorBase>>& pairs,
                          std::vector<std::string>& problems) {
  std::unordered_map<std::string_view, const Entry*> in_file;
  for (const auto& e : entries)
    if (e.name.starts_with(section)) in_file.emplace(e.name, &e);
  std::unordered_set<std::string> wanted;
  for (const auto& [local, t] : state) {
    const std::string name = concat(section, local);
    if (!wanted.insert(name).second) {
      problems.push_back(concat("the ", owner, " has two tensors named '", local, "'"));
      continue;
    }
    if (!t.defined() || t.is_symbolic() || t.device() != Device::cpu) {
      problems.push_back(concat("the ", owner, "'s tensor '", local, "' has no cpu data to load into"));
      continue;
    }
    auto it = in_file.find(name);
    if (it == in_file.end()) {
      problems.push_back(concat("'", name, "' is not in the file (the ", owner, " has it as ", describe(t), ")"));
      continue;
    }
    const Entry& e = *it->second;
    const std::string where = concat("tensor ", e.index, " ('", e.name, "'): ");
    if (e.dtype != t.dtype())
      problems.push_back(
          concat(where, "dtype ", dtype_name(e.dtype), " in the file, the ", owner, " has ", dtype_name(t.dtype())));
    else if (!(e.shape == t.shape()))
      problems.push_back(concat(where, "shape ", e.shape, " in the file, the ", owner, " has ", t.shape()));
    else if (t.impl()->storage->bytes() < e.bytes)
      problems.push_back(concat(where, "the ", owner, "'s tensor has less storage than its shape needs"));
    else
      pairs.emplace_back(&e, t);
  }
  for (const auto& e : entries)
    if (e.name.starts_with(section) && !wanted.contains(e.name))
      problems.push_back(concat("tensor ", e.index, " ('", e.name, "'): the ", owner, " has no tensor of that name"));
}

/// Loads a checkpoint into the module (and the optimizer): all of it, or nothing.
inline void load_into(const std::string& path, const nn::Module& module, const optim::Optimizer* optimizer) {
  const std::vector<unsigned char> file = read_file(path);
  const std::vector<Entry> entries = Parser(path, file).parse();
  std::vector<std::string> problems;
  bool has_optimizer_state = false;
  for (const auto& e : entries) {
    has_optimizer_state |= e.name.starts_with(kOptimizerSection);
    if (!e.name.starts_with(kModelSection) && !e.name.starts_with(kOptimizerSection))
      problems.push_back(concat("tensor ", e.index, " ('", e.name, "'): in neither the '", kModelSection, "' nor the '",
                                kOptimizerSection, "' section (a file of save_tensors?)"));
  }
  std::vector<std::pair<const Entry*, TensorBase>> pairs;
  match_section(kModelSection, "module", module.named_state(), entries, pairs, problems);
  if (optimizer && !has_optimizer_state)
    problems.push_back(
        "the file has no optimizer state (it was saved without an optimizer; load_checkpoint(module, path) reads it)");
  else if (optimizer)
    match_section(kOptimizerSection, optimizer->name() + " optimizer", optimizer->named_state(), entries, pairs,
                  problems);

  if (optimizer)  // values the optimizer's constructor would refuse (a negative learning rate)
    for (const auto& [e, t] : pairs) {
      if (!e->name.starts_with(kOptimizerSection) || e->dtype != DType::float32) continue;
      Tensor<float> value = Tensor<float>::empty(e->shape);
      if (e->bytes) std::memcpy(value.data(), file.data() + e->offset, e->bytes);
      const std::string problem = optimizer->state_problem(e->name.substr(kOptimizerSection.size()), value);
      if (!problem.empty()) problems.push_back(concat("tensor ", e->index, " ('", e->name, "'): ", problem));
    }
  if (problems.size() == 1) throw ValueError(concat("checkpoint '", path, "': ", problems[0]));
  if (!problems.empty()) {
    std::string text = concat("checkpoint '", path, "' does not fit (", problems.size(), " problems):");
    for (const auto& p : problems) text += "\n  " + p;
    throw ValueError(text);
  }
  for (auto& [e, t] : pairs) {
    Storage& storage = *t.impl()->storage;
    if (e->bytes) std::memcpy(storage.data(), file.data() + e->offset, e->bytes);
    // Autodiff then refuses a backward() that saved the old value.
    storage.bump_version();
  }
}

XGRAD_API NamedTensors with_section(std::string_view section, const NamedTensors& state) {
  NamedTensors out;
  for (const auto& [name, t] : state) out.emplace_back(concat(section, name), t);
  return out;
}

}  // namespace detail::ckpt

XGRAD_API void save_tensors(const std::string& path, const std::vector<std::pair<std::string, TensorBase>>& tensors) {
  using namespace detail::ckpt;
  check_savable(path, tensors);
  AtomicFile file(path);
  Encoder header;
  header.raw({reinterpret_cast<const char*>(kMagic.data()), kMagic.size()});
  header.u32(kVersion);
  header.u32(static_cast<std::uint32_t>(tensors.size()));
  file.write(header.bytes);
  for (const auto& [name, t] : tensors) {
    const std::size_t bytes = static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype());
    const auto* payload = static_cast<const unsigned char*>(t.impl()->storage->data());
    Encoder head;
    head.u32(static_cast<std::uint32_t>(name.size()));
    head.raw(name);
    head.u8(dtype_code(t.dtype()));
    head.u8(static_cast<std::uint8_t>(t.ndim()));
    for (std::int64_t d : t.shape()) head.u64(static_cast<std::uint64_t>(d));
    head.u64(bytes);
    Encoder sum;
    sum.u32(crc32(crc32(0, head.bytes.data(), head.bytes.size()), payload, bytes));
    file.write(head.bytes);
    file.write(payload, bytes);
    file.write(sum.bytes);
  }
  Encoder trailer;
  trailer.u32(file.crc());
  file.write(trailer.bytes);
  file.commit();
}

XGRAD_API std::vector<std::pair<std::string, TensorBase>> load_tensors(const std::string& path) {
  using namespace detail::ckpt;
  const std::vector<unsigned char> file = read_file(path);
  std::vector<std::pair<std::string, TensorBase>> out;
  for (const Entry& e : Parser(path, file).parse()) {
    auto impl = TensorImpl::allocate(e.shape, e.dtype);
    if (e.bytes) std::memcpy(impl->storage->data(), file.data() + e.offset, e.bytes);
    out.emplace_back(e.name, TensorBase(std::move(impl)));
  }
  return out;
}

XGRAD_API void save_checkpoint(const nn::Module& module, const std::string& path) {
  save_tensors(path, detail::ckpt::with_section(detail::ckpt::kModelSection, module.named_state()));
}

XGRAD_API void save_checkpoint(const nn::Module& module, const optim::Optimizer& optimizer, const std::string& path) {
  auto tensors = detail::ckpt::with_section(detail::ckpt::kModelSection, module.named_state());
  for (auto& t : detail::ckpt::with_section(detail::ckpt::kOptimizerSection, optimizer.named_state()))
    tensors.push_back(std::move(t));
  save_tensors(path, tensors);
}

XGRAD_API void load_checkpoint(nn::Module& module, const std::string& path) {
  detail::ckpt::load_into(path, module, nullptr);
}

XGRAD_API void load_checkpoint(nn::Module& module, optim::Optimizer& optimizer, const std::string& path) {
  detail::ckpt::load_into(path, module, &optimizer);
}

}  // namespace xgrad
