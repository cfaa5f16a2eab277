// Definitions of data/idx.hpp: included by it when header-only, compiled once into the library
// (src/data.cpp) otherwise.
#pragma once

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <system_error>

#include "xgrad/core/error.hpp"
#include "xgrad/data/idx.hpp"

namespace xgrad::data {

XGRAD_API std::string_view idx_type_name(IdxType type) {
  switch (type) {
    case IdxType::ubyte:
      return "ubyte";
    case IdxType::sbyte:
      return "sbyte";
    case IdxType::int16:
      return "int16";
    case IdxType::int32:
      return "int32";
    case IdxType::float32:
      return "float32";
    case IdxType::float64:
      return "float64";
  }
  return "unknown";
}

XGRAD_API std::size_t idx_type_size(IdxType type) {
  switch (type) {
    case IdxType::ubyte:
    case IdxType::sbyte:
      return 1;
    case IdxType::int16:
      return 2;
    case IdxType::int32:
    case IdxType::float32:
      return 4;
    case IdxType::float64:
      return 8;
  }
  return 0;
}

namespace detail {

/// Largest ndims read_idx accepts.
inline constexpr int k_idx_max_rank = kMaxRank;
/// Payloads above this (1 TiB) are refused before anything is allocated.
inline constexpr std::uint64_t k_idx_max_payload = std::uint64_t{1} << 40;

template <class... Parts> [[noreturn]] void throw_idx_error(const std::string& path, const Parts&... parts) {
  throw ValueError(xgrad::detail::concat("IDX file '", path, "': ", parts...));
}

/// "1 byte", "3 bytes"
inline std::string byte_count(std::uint64_t n) { return xgrad::detail::concat(n, n == 1 ? " byte" : " bytes"); }

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

/// Reads a file's bytes in order; gzip files are inflated on the fly. read() returns fewer
/// bytes than asked only where the (decompressed) data really ends; a damaged or truncated
/// gzip stream throws, naming `what` (the field being read).
class IdxStream {
 public:
  IdxStream(const std::string& path, FilePtr file, bool gzip) : m_path(path), m_file(std::move(file)), m_gzip(gzip) {
    if (m_gzip) {
      // 16 + MAX_WBITS: expect a gzip wrapper and check its CRC and length trailer.
      if (inflateInit2(&m_z, 16 + MAX_WBITS) != Z_OK) throw_idx_error(m_path, "zlib could not start inflating");
      m_z_open = true;
    }
  }
  IdxStream(const IdxStream&) = delete;
  IdxStream& operator=(const IdxStream&) = delete;
  ~IdxStream() {
    if (m_z_open) inflateEnd(&m_z);
  }

  std::size_t read(void* dst, std::size_t n, std::string_view what) {
    if (!m_gzip) return read_file(dst, n, what);
    auto* out = static_cast<unsigned char*>(dst);
    std::size_t done = 0;
    while (done < n && !m_ended) {
      if (m_z.avail_in == 0) refill(what);
      const std::size_t chunk = std::min<std::size_t>(n - done, std::numeric_limits<uInt>::max());
      m_z.next_out = out + done;
      m_z.avail_out = static_cast<uInt>(chunk);
      const int ret = inflate(&m_z, Z_NO_FLUSH);
      done += chunk - m_z.avail_out;
      if (ret == Z_STREAM_END) {
        next_member(what);
      } else if (ret == Z_BUF_ERROR) {
        // No progress although output space was left: inflate needs input the file does not have.
        throw_idx_error(m_path, "the gzip data ends in the middle of the compressed stream (truncated file) ",
                        "while reading ", what);
      } else if (ret != Z_OK) {
        throw_idx_error(m_path, "corrupt gzip data while reading ", what, " (zlib: ", m_z.msg ? m_z.msg : "error ",
                        m_z.msg ? "" : std::to_string(ret), ")");
      }
    }
    return done;
  }

 private:
  std::size_t read_file(void* dst, std::size_t n, std::string_view what) {
    const std::size_t got = std::fread(dst, 1, n, m_file.get());
    if (got < n && std::ferror(m_file.get())) throw_idx_error(m_path, "read error while reading ", what);
    return got;
  }

  /// Tops up the compressed input; false at the end of the file.
  bool refill(std::string_view what) {
    const std::size_t got = read_file(m_in.data(), m_in.size(), what);
    m_z.next_in = m_in.data();
    m_z.avail_in = static_cast<uInt>(got);
    return got > 0;
  }

  // A gzip file may hold several members back to back (gzip a b > c); anything else after a
  // member is not gzip data and is refused.
  void next_member(std::string_view what) {
    if (m_z.avail_in == 0 && !refill(what)) {
      m_ended = true;
      return;
    }
    if (m_z.avail_in < 2 && m_z.next_in != m_in.data()) {
      std::memmove(m_in.data(), m_z.next_in, m_z.avail_in);
      const std::size_t more = read_file(m_in.data() + m_z.avail_in, m_in.size() - m_z.avail_in, what);
      m_z.next_in = m_in.data();
      m_z.avail_in += static_cast<uInt>(more);
    }
    if (m_z.avail_in < 2 || m_z.next_in[0] != 0x1f || m_z.next_in[1] != 0x8b)
      throw_idx_error(m_path, "bytes after the end of the gzip stream are not another gzip member");
    inflateReset(&m_z);
  }

  std::string m_path;
  FilePtr m_file;
  bool m_gzip;
  z_stream m_z{};
  bool m_z_open = false;
  bool m_ended = false;
  std::vector<unsigned char> m_in = std::vector<unsigned char>(std::size_t{1} << 16);  // compressed input
};

/// Reads exactly n bytes of `what` or throws, saying how many there were.
inline void read_exact(IdxStream& in, const std::string& path, bool gzip, void* dst, std::size_t n, std::size_t offset,
                       std::string_view what) {
  const std::size_t got = in.read(dst, n, what);
  if (got < n)
    throw_idx_error(path, what, ": expected ", byte_count(n), " at offset ", offset, ", the ",
                    gzip ? "decompressed data" : "file", " ends after ", byte_count(got));
}

inline bool is_idx_type(std::uint8_t b) {
  return b == 0x08 || b == 0x09 || b == 0x0B || b == 0x0C || b == 0x0D || b == 0x0E;
}

inline std::string hex_byte(unsigned b) {
  const char* digits = "0123456789ABCDEF";
  return std::string("0x") + digits[(b >> 4) & 0xF] + digits[b & 0xF];
}

/// Reverses the bytes of each element (IDX stores them big-endian).
inline void swap_elements(std::vector<unsigned char>& bytes, std::size_t width) {
  if (width == 1 || std::endian::native == std::endian::big) return;
  for (std::size_t i = 0; i + width <= bytes.size(); i += width) std::reverse(&bytes[i], &bytes[i] + width);
}

}  // namespace detail

XGRAD_API IdxArray read_idx(const std::string& path) {
  using detail::byte_count;
  using detail::throw_idx_error;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw_idx_error(path, "is a directory, expected a file");
  errno = 0;
  detail::FilePtr file(std::fopen(path.c_str(), "rb"));
  if (!file) throw_idx_error(path, "cannot open it (", std::strerror(errno), ")");

  unsigned char first[2] = {0, 0};
  const std::size_t sniffed = std::fread(first, 1, 2, file.get());
  const bool gzip = sniffed == 2 && first[0] == 0x1f && first[1] == 0x8b;
  const long end = std::fseek(file.get(), 0, SEEK_END) == 0 ? std::ftell(file.get()) : -1;
  if (end < 0) throw_idx_error(path, "cannot determine its size (not a regular file?)");
  const auto file_size = static_cast<std::uint64_t>(end);
  std::rewind(file.get());
  detail::IdxStream in(path, std::move(file), gzip);

  unsigned char magic[4];
  detail::read_exact(in, path, gzip, magic, 4, 0, "magic");
  if (magic[0] != 0 || magic[1] != 0)
    throw_idx_error(path, "magic: expected 0x00 0x00 <type> <ndims>, got ", detail::hex_byte(magic[0]), " ",
                    detail::hex_byte(magic[1]), " ", detail::hex_byte(magic[2]), " ", detail::hex_byte(magic[3]),
                    gzip ? " (after gunzip)" : "");
  if (!detail::is_idx_type(magic[2]))
    throw_idx_error(path, "type byte: expected 0x08 (ubyte), 0x09 (sbyte), 0x0B (int16), 0x0C (int32), ",
                    "0x0D (float32) or 0x0E (float64), got ", detail::hex_byte(magic[2]));
  const int ndims = magic[3];
  if (ndims < 1 || ndims > detail::k_idx_max_rank)
    throw_idx_error(path, "ndims: expected 1 to ", detail::k_idx_max_rank, ", got ", ndims);

  IdxArray out;
  out.type = static_cast<IdxType>(magic[2]);
  const std::size_t width = idx_type_size(out.type);
  std::uint64_t payload = width;
  for (int d = 0; d < ndims; ++d) {
    const std::string field = xgrad::detail::concat("dimension ", d);
    unsigned char be[4];
    detail::read_exact(in, path, gzip, be, 4, 4 + 4 * static_cast<std::size_t>(d), field);
    const std::uint32_t dim = (std::uint32_t{be[0]} << 24) | (std::uint32_t{be[1]} << 16) |
                              (std::uint32_t{be[2]} << 8) | std::uint32_t{be[3]};
    if (dim == 0) throw_idx_error(path, field, " is 0, expected > 0");
    // Checked before multiplying, so the product never wraps.
    if (payload > detail::k_idx_max_payload / dim)
      throw_idx_error(path, field, " is ", dim, ", which makes the payload larger than the ", detail::k_idx_max_payload,
                      "-byte limit");
    payload *= dim;
    out.shape.push_back(dim);
  }

  const std::uint64_t header = 4 + 4 * static_cast<std::uint64_t>(ndims);
  const std::string what = xgrad::detail::concat("payload (", out.shape, " ", idx_type_name(out.type), ")");
  if (!gzip) {
    if (file_size < header + payload)
      throw_idx_error(path, what, ": expected ", byte_count(payload), " after the ", header,
                      "-byte header, the file has ", byte_count(file_size - header));
    if (file_size > header + payload)
      throw_idx_error(path, what, ": expected the file to end after ", byte_count(payload), ", it has ",
                      byte_count(file_size - header - payload), " more");
    out.bytes.resize(static_cast<std::size_t>(payload));
    detail::read_exact(in, path, gzip, out.bytes.data(), out.bytes.size(), header, what);
  } else {
    // The header of a compressed file cannot be checked against its size: grow the buffer as
    // data arrives, so a lying header costs at most twice the bytes really there.
    constexpr std::size_t k_first_chunk = std::size_t{1} << 20;
    while (out.bytes.size() < payload) {
      const std::size_t have = out.bytes.size();
      const std::size_t want =
          static_cast<std::size_t>(std::min<std::uint64_t>(payload, std::max(2 * have, k_first_chunk)));
      out.bytes.resize(want);
      const std::size_t got = in.read(out.bytes.data() + have, want - have, what);
      if (got < want - have)
        throw_idx_error(path, what, ": expected ", byte_count(payload), " after the ", header,
                        "-byte header, the decompressed data has ", byte_count(have + got));
    }
    unsigned char extra[256];
    if (const std::size_t more = in.read(extra, sizeof extra, "the end of the data"))
      throw_idx_error(path, what, ": expected the decompressed data to end after ", byte_count(payload), ", it has ",
                      more == sizeof extra ? "at least " : "", byte_count(more), " more");
  }
  detail::swap_elements(out.bytes, width);
  return out;
}

}  // namespace xgrad::data
