// Read-only memory-mapped file. The mapping lives as long as any shared_ptr to it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace wan {
class MappedFile {
 public:
  // Throws wan::Error "<path>: cannot open: <strerror>" on failure. Empty files map to size 0.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};
}  // namespace wan
