// safetensors reading (memory-mapped, zero-copy, strictly validated) and writing (streaming).
// Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets:
// [begin, end]}, "__metadata__": {str: str}}, then the data section; offsets are relative to the
// data section start.
// Invariants: open() validates everything before returning (header length bounds, well-formed JSON,
// known dtype, shape x dtype size == byte length, ranges inside the file, no overlaps); any defect
// throws wan::Error naming the file (and the tensor when there is one). Views never outlive the
// mapping (they hold a shared_ptr to it).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/mmap.h"
#include "core/tensor.h"

namespace wan {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte range in the data section
  size_t nbytes() const { return static_cast<size_t>(end - begin); }
};

class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  const std::string& path() const { return file_->path(); }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // sorted by begin offset
  const TensorInfo* find(const std::string& name) const;  // nullptr if absent
  Tensor get(const std::string& name) const;  // zero-copy view; throws if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const uint8_t* data_section() const;
  // Absolute file offset of the data section (8 + header length): tensor bytes lie at
  // data_start() + begin .. data_start() + end in the file (for streaming reads that bypass the mapping).
  size_t data_start() const { return data_start_; }

 private:
  std::shared_ptr<MappedFile> file_;
  size_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// One name -> tensor map over a single file or the shards listed in a *.safetensors.index.json
// ({"weight_map": {name: shard_file}}). Every shard is opened and validated; a name mapped to a
// shard that does not contain it, or present in two shards, is an error.
class SafetensorsSet {
 public:
  // path: a .safetensors file, a .safetensors.index.json, or a folder holding exactly one of
  // those (an index json is preferred when both exist).
  static SafetensorsSet open(const std::string& path);
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;
  Tensor get(const std::string& name) const;
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }
  std::string source() const { return source_; }

 private:
  std::string source_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // name -> index into files_
};

// ---- writing ----
struct TensorSpec {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  size_t nbytes() const { return static_cast<size_t>(shape.numel()) * dtype_size(dtype); }
};
// Fills the bytes of one tensor (dst has spec.nbytes() bytes).
using TensorFill = std::function<void(const TensorSpec& spec, void* dst)>;

// Writes one file, tensors in the given order, streaming (one tensor in memory at a time).
// Writes a unique temporary file next to the target and renames it over the target on success
// (formats/output_file.h: permissions kept, symlinks written through); on failure it is removed.
// Tensors are contiguous (no padding, as the format's reference reader demands), so a tensor is
// aligned for its element type (and read back zero-copy) when the byte sizes of all tensors before
// it are multiples of its element size; ordering specs by element size, largest first, as the
// reference writer does, guarantees that. A misaligned tensor is still read correctly (copied).
void write_safetensors(const std::string& path, const std::vector<TensorSpec>& specs, const TensorFill& fill,
                       const std::map<std::string, std::string>& metadata = {});
// Convenience: write host tensors.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// Writes "<dir>/<prefix>-0000k-of-0000N.safetensors" shards of at most max_shard_bytes each (a tensor
// larger than that gets its own shard) plus "<dir>/<prefix>.safetensors.index.json" with
// {"metadata": {"total_size": ...}, "weight_map": {...}}; with one shard, writes
// "<dir>/<prefix>.safetensors" and no index. Returns the paths written.
std::vector<std::string> write_safetensors_sharded(const std::string& dir, const std::string& prefix,
                                                   const std::vector<TensorSpec>& specs, const TensorFill& fill,
                                                   size_t max_shard_bytes);

}  // namespace wan
