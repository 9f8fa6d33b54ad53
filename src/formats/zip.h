// Just enough ZIP for torch.save archives: reading the central directory of a mapped file
// (ZIP64 included) and streaming out "stored" entries whose data starts 64-byte aligned.
// Reader invariants: every offset and size comes from the central directory (torch's writer
// leaves sizes and CRCs out of the local headers and puts them in data descriptors), and each is
// checked against the file size before use, so a corrupt archive is an error, never an
// out-of-bounds read. Compressed entries are listed (method != 0) but cannot be mapped.
// Writer invariants: local headers carry the real CRC and sizes (no data descriptors), so the
// caller hands over each entry's bytes in one piece; ZIP64 records are written when a size or an
// offset does not fit 32 bits (or when forced, to exercise readers on small files).
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace wan::zip {

struct Entry {
  std::string name;
  uint16_t method = 0;        // 0 = stored
  uint16_t flags = 0;
  uint32_t crc32 = 0;         // from the central directory
  uint64_t size = 0;          // uncompressed bytes
  uint64_t csize = 0;         // bytes in the archive
  uint64_t data_offset = 0;   // absolute file offset of the entry's bytes
};

// Lists the entries of the archive held in [data, data + size). `what` names the file in errors.
// Throws wan::Error for anything malformed (no end record, multi-disk, entries outside the file,
// local header not matching the central directory, duplicate names, encryption).
std::vector<Entry> read_directory(const uint8_t* data, size_t size, const std::string& what);

// CRC-32 (ISO-HDLC, as zip uses). Start with crc = 0; feed chunks by passing the previous result.
uint32_t crc32(uint32_t crc, const void* data, size_t n);

class Writer {
 public:
  struct Options {
    bool force_zip64 = false;  // write ZIP64 extra fields and end records even for small archives
    size_t align = 64;         // data of each entry starts at a multiple of this (torch: 64)
  };
  // Opens (truncates) `path`. Throws wan::Error on failure.
  Writer(const std::string& path, Options opt);
  ~Writer();  // closes the file if finish() was not reached; never removes it
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Appends one stored entry.
  void add(const std::string& name, const void* data, size_t n);
  // Writes the central directory and end records, flushes and closes. Throws on I/O failure.
  void finish();
  uint64_t bytes_written() const { return pos_; }

 private:
  struct Record {
    std::string name;
    uint32_t crc;
    uint64_t size;
    uint64_t offset;  // of the local header
  };
  void write(const void* p, size_t n);
  void write_u16(uint16_t v);
  void write_u32(uint32_t v);
  void write_u64(uint64_t v);

  std::string path_;
  Options opt_;
  std::FILE* f_ = nullptr;
  uint64_t pos_ = 0;
  std::vector<Record> records_;
};

}  // namespace wan::zip
