// PyTorch .pth (torch.save zip format) reading and writing, without executing any pickle.
// Reading: the zip central directory is parsed (ZIP64 included; only stored entries can be
// mapped, deflate is refused with a clear error), "<archive>/data.pkl" is interpreted by a
// restricted pickle machine (formats/pickle.h) that accepts only the opcodes and globals a tensor
// state dict needs (collections.OrderedDict, torch._utils._rebuild_tensor_v2/_v3,
// _rebuild_parameter, torch.*Storage / torch.storage.UntypedStorage, torch.<dtype>, and
// persistent ids ("storage", type, key, location, numel)); anything else is refused with a
// wan::Error naming the file and the opcode or global. Nested dicts are flattened with "."
// (e.g. {"model": {...}} gives "model.<name>"; the caller strips such prefixes); non-tensor
// leaves (ints, strings, lists, a state dict's _metadata) are skipped. Legacy (pre-1.6,
// non-zip) files are refused. Tensors are zero-copy views into the mapped file when contiguous
// and aligned for their element type; otherwise copied into contiguous memory.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/mmap.h"
#include "core/tensor.h"
#include "formats/safetensors.h"  // TensorSpec, TensorFill

namespace wan {

struct PthTensorInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  std::vector<int64_t> stride;   // elements
  int64_t storage_offset = 0;    // elements
  std::string storage_key;       // "data/<key>" entry in the archive
};

class PthFile {
 public:
  // Maps and validates the whole file (zip records, pickle, every tensor's extent); throws
  // wan::Error "<path>: ..." on any defect, before any tensor is handed out.
  static std::shared_ptr<PthFile> open(const std::string& path);
  const std::string& path() const { return file_->path(); }
  const std::vector<PthTensorInfo>& tensors() const { return tensors_; }  // in pickle order
  const PthTensorInfo* find(const std::string& name) const;
  // Contiguous host tensor: a view that keeps the mapping alive when possible, else a copy.
  // Throws when the name is absent. Safe to call from several threads.
  Tensor get(const std::string& name) const;
  // (absolute file offset, bytes) of a stored record "data/<key>" (PthTensorInfo::storage_key);
  // nullptr when absent. For streaming reads that bypass the mapping.
  const std::pair<size_t, size_t>* record(const std::string& storage_key) const {
    auto it = records_.find(storage_key);
    return it == records_.end() ? nullptr : &it->second;
  }

 private:
  std::shared_ptr<MappedFile> file_;
  std::vector<PthTensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::pair<size_t, size_t>> records_;  // entry name -> (offset, size) of data
  friend struct PthReader;
};

// Writes a state dict (OrderedDict of contiguous tensors) loadable by torch.load(weights_only=True),
// streaming one tensor at a time. Archive name = file stem. Writes "<path>.tmp" then renames.
// Layout as torch.save: protocol-2 data.pkl, one stored record per tensor at a 64-byte aligned
// offset, ZIP64 records when an entry or the archive passes 4 GiB.
struct PthWriteOptions {
  bool force_zip64 = false;  // ZIP64 records even for a small file (to test readers)
};
void write_pth(const std::string& path, const std::vector<TensorSpec>& specs, const TensorFill& fill,
               const PthWriteOptions& opt = {});

}  // namespace wan
