// ZIP central-directory reader and stored-entry writer (see zip.h for the invariants).
// Record layouts follow PKWARE APPNOTE 6.3: local header (0x04034b50, 30 bytes + name + extra),
// central header (0x02014b50, 46 bytes + name + extra + comment), end record (0x06054b50, 22
// bytes + comment), ZIP64 end record (0x06064b50, 56 bytes) and its locator (0x07064b50, 20 bytes)
// just before the end record, and the ZIP64 extra field (id 0x0001) whose 64-bit values appear
// only for the 32-bit fields that hold 0xFFFFFFFF, in the order size, csize, offset, disk.
#include "formats/zip.h"

#include <array>
#include <cerrno>
#include <cstring>
#include <unordered_set>

#include "core/error.h"

namespace wan::zip {
namespace {

constexpr uint32_t kLocalSig = 0x04034b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint32_t kEnd64Sig = 0x06064b50;
constexpr uint32_t kLocator64Sig = 0x07064b50;
constexpr size_t kLocalSize = 30, kCentralSize = 46, kEndSize = 22, kEnd64Size = 56, kLocator64Size = 20;
constexpr uint16_t kZip64ExtraId = 0x0001;
// torch's writer pads with an extra field tagged "FB"; readers skip unknown extra ids.
constexpr uint16_t kPadExtraId = 0x4246;
constexpr uint32_t k32 = 0xFFFFFFFFu;
constexpr uint16_t k16 = 0xFFFFu;

uint16_t rd16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t rd32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}
uint64_t rd64(const uint8_t* p) { return rd32(p) | (static_cast<uint64_t>(rd32(p + 4)) << 32); }

// True when [off, off + n) lies inside [0, size), without overflow.
bool fits(uint64_t off, uint64_t n, uint64_t size) { return off <= size && n <= size - off; }

// Slicing-by-8 tables: table[0] is the classic byte table; table[k][b] advances it by k zero bytes.
struct CrcTables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  constexpr CrcTables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int k = 1; k < 8; ++k) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFFu];
  }
};
constexpr CrcTables kCrc;

}  // namespace

uint32_t crc32(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  const auto& t = kCrc.t;
  uint32_t c = ~crc;
  while (n >= 8) {
    uint32_t lo = rd32(p) ^ c, hi = rd32(p + 4);
    c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^ t[3][hi & 0xFF] ^
        t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) c = t[0][(c ^ *p++) & 0xFFu] ^ (c >> 8);
  return ~c;
}

std::vector<Entry> read_directory(const uint8_t* data, size_t size, const std::string& what) {
  WAN_CHECK(size >= kEndSize, what, ": not a zip archive (", size, " bytes, too short)");
  // The end record sits at the very end unless a comment (at most 64 KiB) follows it.
  size_t end_pos = SIZE_MAX;
  size_t lowest = size - kEndSize >= 0xFFFF ? size - kEndSize - 0xFFFF : 0;
  for (size_t p = size - kEndSize + 1; p-- > lowest;) {
    if (rd32(data + p) == kEndSig && p + kEndSize + rd16(data + p + 20) <= size) {
      end_pos = p;
      break;
    }
  }
  WAN_CHECK(end_pos != SIZE_MAX, what, ": not a zip archive or truncated (no end-of-central-directory record)");
  const uint8_t* e = data + end_pos;
  uint64_t disk = rd16(e + 4), cd_disk = rd16(e + 6);
  uint64_t count_disk = rd16(e + 8), count = rd16(e + 10);
  uint64_t cd_size = rd32(e + 12), cd_offset = rd32(e + 16);
  uint64_t cd_limit = end_pos;  // the central directory must end before this
  if (end_pos >= kLocator64Size && rd32(e - kLocator64Size) == kLocator64Sig) {
    const uint8_t* loc = e - kLocator64Size;
    uint64_t rec = rd64(loc + 8);
    WAN_CHECK(rd32(loc + 4) == 0 && rd32(loc + 16) <= 1, what, ": multi-disk zip archives are not supported");
    WAN_CHECK(rec <= end_pos - kLocator64Size && end_pos - kLocator64Size - rec >= kEnd64Size, what,
              ": corrupt zip: ZIP64 end record offset ", rec, " is outside the archive");
    const uint8_t* z = data + rec;
    WAN_CHECK(rd32(z) == kEnd64Sig, what, ": corrupt zip: no ZIP64 end record at offset ", rec);
    disk = rd32(z + 16);
    cd_disk = rd32(z + 20);
    count_disk = rd64(z + 24);
    count = rd64(z + 32);
    cd_size = rd64(z + 40);
    cd_offset = rd64(z + 48);
    cd_limit = rec;
  } else {
    WAN_CHECK(count != k16 && cd_size != k32 && cd_offset != k32, what,
              ": corrupt zip: end record needs ZIP64 values but the ZIP64 locator is missing");
  }
  WAN_CHECK(disk == 0 && cd_disk == 0 && count_disk == count, what, ": multi-disk zip archives are not supported");
  WAN_CHECK(fits(cd_offset, cd_size, cd_limit), what, ": corrupt or truncated zip: central directory [", cd_offset,
            ", +", cd_size, ") is outside the archive (", size, " bytes)");
  WAN_CHECK(count <= cd_size / kCentralSize, what, ": corrupt zip: ", count, " entries cannot fit in a ", cd_size,
            "-byte central directory");

  std::vector<Entry> out;
  out.reserve(static_cast<size_t>(count));
  std::unordered_set<std::string> names;
  const uint64_t cd_end = cd_offset + cd_size;
  uint64_t p = cd_offset;
  for (uint64_t i = 0; i < count; ++i) {
    WAN_CHECK(fits(p, kCentralSize, cd_end) && rd32(data + p) == kCentralSig, what,
              ": corrupt zip: bad central directory header #", i, " at offset ", p);
    const uint8_t* c = data + p;
    Entry en;
    en.flags = rd16(c + 8);
    en.method = rd16(c + 10);
    en.crc32 = rd32(c + 16);
    en.csize = rd32(c + 20);
    en.size = rd32(c + 24);
    uint16_t name_len = rd16(c + 28), extra_len = rd16(c + 30), comment_len = rd16(c + 32);
    uint64_t entry_disk = rd16(c + 34);
    uint64_t local = rd32(c + 42);
    uint64_t var_len = uint64_t{name_len} + extra_len + comment_len;
    WAN_CHECK(fits(p + kCentralSize, var_len, cd_end), what, ": corrupt zip: central directory header #", i,
              " runs past the directory");
    en.name.assign(reinterpret_cast<const char*>(c + kCentralSize), name_len);
    // ZIP64 extra: 64-bit replacements for the fields saturated at 0xFFFFFFFF / 0xFFFF.
    const uint8_t* x = c + kCentralSize + name_len;
    const uint8_t* x_end = x + extra_len;
    while (x_end - x >= 4) {
      uint16_t id = rd16(x), len = rd16(x + 2);
      WAN_CHECK(len <= x_end - x - 4, what, ": corrupt zip: extra field of '", en.name, "' runs past its header");
      if (id == kZip64ExtraId) {
        const uint8_t* v = x + 4;
        const uint8_t* v_end = v + len;
        auto take = [&](uint64_t& field) {
          WAN_CHECK(v_end - v >= 8, what, ": corrupt zip: ZIP64 extra field of '", en.name, "' is too short");
          field = rd64(v);
          v += 8;
        };
        if (en.size == k32) take(en.size);
        if (en.csize == k32) take(en.csize);
        if (local == k32) take(local);
        if (entry_disk == k16) {
          WAN_CHECK(v_end - v >= 4, what, ": corrupt zip: ZIP64 extra field of '", en.name, "' is too short");
          entry_disk = rd32(v);
        }
      }
      x += 4 + len;
    }
    WAN_CHECK(entry_disk == 0, what, ": multi-disk zip archives are not supported");
    WAN_CHECK(!(en.flags & 1u), what, ": zip entry '", en.name, "' is encrypted");
    WAN_CHECK(names.insert(en.name).second, what, ": corrupt zip: duplicate entry '", en.name, "'");

    // The local header repeats the name; its own extra field (torch's alignment padding) decides
    // where the data starts. Data must end before the central directory.
    WAN_CHECK(fits(local, kLocalSize, cd_offset) && rd32(data + local) == kLocalSig, what,
              ": corrupt or truncated zip: no local header for '", en.name, "' at offset ", local);
    const uint8_t* l = data + local;
    uint64_t l_name = rd16(l + 26), l_extra = rd16(l + 28);
    WAN_CHECK(fits(local + kLocalSize, l_name + l_extra, cd_offset) && l_name == name_len &&
                  std::memcmp(l + kLocalSize, en.name.data(), name_len) == 0,
              what, ": corrupt zip: local header of '", en.name, "' does not match the central directory");
    en.data_offset = local + kLocalSize + l_name + l_extra;
    WAN_CHECK(fits(en.data_offset, en.csize, cd_offset), what, ": corrupt or truncated zip: data of '", en.name,
              "' [", en.data_offset, ", +", en.csize, ") is outside the archive");
    WAN_CHECK(en.method != 0 || en.csize == en.size, what, ": corrupt zip: stored entry '", en.name,
              "' has size ", en.size, " but occupies ", en.csize, " bytes");
    out.push_back(std::move(en));
    p += kCentralSize + var_len;
  }
  return out;
}

// ---- writer ----

Writer::Writer(const std::string& path, Options opt) : path_(path), opt_(opt) {
  WAN_ASSERT(opt_.align >= 1 && opt_.align <= 4096);
  f_ = std::fopen(path.c_str(), "wb");
  if (!f_) WAN_THROW(path, ": cannot create: ", std::strerror(errno));
}

Writer::~Writer() {
  if (f_) std::fclose(f_);
}

void Writer::write(const void* p, size_t n) {
  WAN_ASSERT(f_ != nullptr, "zip writer already finished");
  if (n && std::fwrite(p, 1, n, f_) != n) WAN_THROW(path_, ": write failed: ", std::strerror(errno));
  pos_ += n;
}
void Writer::write_u16(uint16_t v) {
  uint8_t b[2] = {static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8)};
  write(b, 2);
}
void Writer::write_u32(uint32_t v) {
  write_u16(static_cast<uint16_t>(v));
  write_u16(static_cast<uint16_t>(v >> 16));
}
void Writer::write_u64(uint64_t v) {
  write_u32(static_cast<uint32_t>(v));
  write_u32(static_cast<uint32_t>(v >> 32));
}

void Writer::add(const std::string& name, const void* data, size_t n) {
  WAN_ASSERT(name.size() < 0xFFFF, "zip entry name too long");
  Record r{name, crc32(0, data, n), n, pos_};
  bool zip64 = opt_.force_zip64 || n >= k32;
  uint16_t zip64_len = zip64 ? 4 + 16 : 0;
  uint64_t before_pad = pos_ + kLocalSize + name.size() + zip64_len + 4;
  uint16_t pad = static_cast<uint16_t>((opt_.align - before_pad % opt_.align) % opt_.align);
  write_u32(kLocalSig);
  write_u16(zip64 ? 45 : 20);  // version needed: 4.5 for ZIP64
  write_u16(0x0800);           // UTF-8 names; sizes and CRC are in this header (no descriptor)
  write_u16(0);                // stored
  write_u16(0);                // time
  write_u16(0x21);             // date: 1980-01-01
  write_u32(r.crc);
  write_u32(zip64 ? k32 : static_cast<uint32_t>(n));
  write_u32(zip64 ? k32 : static_cast<uint32_t>(n));
  write_u16(static_cast<uint16_t>(name.size()));
  write_u16(static_cast<uint16_t>(zip64_len + 4 + pad));
  write(name.data(), name.size());
  if (zip64) {
    write_u16(kZip64ExtraId);
    write_u16(16);
    write_u64(n);
    write_u64(n);
  }
  write_u16(kPadExtraId);
  write_u16(pad);
  static const char kPad[4096] = {};
  write(kPad, pad);
  WAN_ASSERT(pos_ % opt_.align == 0);
  write(data, n);
  records_.push_back(std::move(r));
}

void Writer::finish() {
  uint64_t cd_offset = pos_;
  for (const Record& r : records_) {
    bool big_size = opt_.force_zip64 || r.size >= k32;
    bool big_off = opt_.force_zip64 || r.offset >= k32;
    uint16_t x_len = static_cast<uint16_t>((big_size ? 16 : 0) + (big_off ? 8 : 0));
    write_u32(kCentralSig);
    write_u16(45);  // made by: 4.5, MS-DOS attributes
    write_u16(x_len ? 45 : 20);
    write_u16(0x0800);
    write_u16(0);
    write_u16(0);
    write_u16(0x21);
    write_u32(r.crc);
    write_u32(big_size ? k32 : static_cast<uint32_t>(r.size));
    write_u32(big_size ? k32 : static_cast<uint32_t>(r.size));
    write_u16(static_cast<uint16_t>(r.name.size()));
    write_u16(x_len ? 4 + x_len : 0);
    write_u16(0);  // comment
    write_u16(0);  // disk
    write_u16(0);  // internal attributes
    write_u32(0);  // external attributes
    write_u32(big_off ? k32 : static_cast<uint32_t>(r.offset));
    write(r.name.data(), r.name.size());
    if (x_len) {
      write_u16(kZip64ExtraId);
      write_u16(x_len);
      if (big_size) {
        write_u64(r.size);
        write_u64(r.size);
      }
      if (big_off) write_u64(r.offset);
    }
  }
  uint64_t cd_size = pos_ - cd_offset;
  uint64_t count = records_.size();
  bool zip64 = opt_.force_zip64 || count >= k16 || cd_size >= k32 || cd_offset >= k32;
  if (zip64) {
    uint64_t rec = pos_;
    write_u32(kEnd64Sig);
    write_u64(kEnd64Size - 12);  // size of the rest of this record
    write_u16(45);
    write_u16(45);
    write_u32(0);
    write_u32(0);
    write_u64(count);
    write_u64(count);
    write_u64(cd_size);
    write_u64(cd_offset);
    write_u32(kLocator64Sig);
    write_u32(0);
    write_u64(rec);
    write_u32(1);
  }
  // Forced mode saturates every field so that readers must take the ZIP64 values.
  bool sat = opt_.force_zip64;
  write_u32(kEndSig);
  write_u16(0);
  write_u16(0);
  write_u16(sat || count >= k16 ? k16 : static_cast<uint16_t>(count));
  write_u16(sat || count >= k16 ? k16 : static_cast<uint16_t>(count));
  write_u32(sat || cd_size >= k32 ? k32 : static_cast<uint32_t>(cd_size));
  write_u32(sat || cd_offset >= k32 ? k32 : static_cast<uint32_t>(cd_offset));
  write_u16(0);
  std::FILE* f = f_;
  f_ = nullptr;
  bool ok = std::fflush(f) == 0;
  int err = errno;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) WAN_THROW(path_, ": write failed: ", std::strerror(err ? err : errno));
}

}  // namespace wan::zip
