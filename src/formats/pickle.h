// A restricted pickle machine for torch.save's data.pkl: it builds plain values (ints, strings,
// tuples, dicts, tensor records) and never runs code. Only the opcodes a tensor state dict needs
// are accepted, and only these globals: collections.OrderedDict, torch._utils._rebuild_tensor_v2/
// _v3/_rebuild_parameter(_with_state), the torch.*Storage classes, torch.storage.UntypedStorage,
// and torch.<dtype> objects. Anything else is refused with a wan::Error naming the opcode or global.
// Invariants: every read is bounds-checked against the pickle bytes; the stack, the mark stack and
// the memo are bounded (by the input size and kMaxMarkDepth), values live in an arena owned by the
// Unpickler (so self-referencing containers cannot leak), and "calls" are interpreted, not run.
// Persistent ids become Storage values; tensor extents are checked later against the archive.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/dtype.h"

namespace wan::pickle {

enum class Kind : uint8_t {
  None, Bool, Int, Float, Str, Bytes, Tuple, List, Dict,
  Callable,     // a whitelisted function/class, interpreted by REDUCE
  StorageType,  // torch.FloatStorage, ..., torch.storage.UntypedStorage
  DTypeObj,     // torch.float32, ...
  Storage,      // a persistent id ("storage", type, key, location, numel)
  Tensor,       // result of _rebuild_tensor_v2/_v3 (or _rebuild_parameter)
};

enum class Fn : uint8_t { OrderedDict, RebuildTensorV2, RebuildTensorV3, RebuildParameter, RebuildParameterWithState };

struct Value {
  Kind kind = Kind::None;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                               // Str, Bytes; Storage key; global name (Callable/StorageType/DTypeObj)
  std::vector<Value*> items;                   // Tuple, List
  std::vector<std::pair<Value*, Value*>> dict; // Dict, in insertion order
  std::unique_ptr<std::unordered_map<std::string, size_t>> dict_index;  // Dict: key -> position in `dict`
  Fn fn = Fn::OrderedDict;                     // Callable
  bool typed = true;                           // StorageType/Storage: false for UntypedStorage (numel in bytes)
  DType dtype = DType::F32;                    // StorageType, DTypeObj, Storage, Tensor
  int64_t numel = 0;                           // Storage: elements (typed) or bytes (untyped)
  // Tensor
  const Value* storage = nullptr;
  int64_t storage_offset = 0;                  // elements
  std::vector<int64_t> size, stride;           // elements
};

class Unpickler {
 public:
  static constexpr size_t kMaxMarkDepth = 256;
  // `what` is prepended to errors (e.g. "model.pth: data.pkl").
  Unpickler(const uint8_t* data, size_t size, std::string what);
  // Runs to STOP and returns the top of the stack. The result lives as long as this Unpickler.
  const Value* load();

 private:
  Value* make(Kind k);
  Value* make_dict();
  Value* pop();
  std::vector<Value*> pop_mark();
  const uint8_t* take(size_t n);
  uint64_t take_uint(size_t width);  // little-endian unsigned
  std::string take_line(size_t at);
  Value* global(const std::string& module, const std::string& name);
  Value* reduce(Value* callable, Value* args);
  void set_item(Value* dict, Value* key, Value* value);
  void build(Value* state, size_t at);
  Value* persistent_storage(Value* pid, size_t at);
  // One handler per opcode family, called by load() with the opcode and the byte it starts at; each
  // returns false for an opcode outside its family.
  bool framing_op(uint8_t op);               // PROTO, FRAME
  bool stack_op(uint8_t op, size_t at);      // MARK and the memo
  bool string_op(uint8_t op, size_t at);     // str and bytes constants
  bool number_op(uint8_t op, size_t at);     // int, bool, None and float constants
  bool container_op(uint8_t op, size_t at);  // tuples, lists, dicts and filling them
  bool object_op(uint8_t op, size_t at);     // globals, REDUCE, BUILD, persistent ids
  [[noreturn]] void fail(const std::string& msg) const;

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  std::string what_;
  std::vector<std::unique_ptr<Value>> arena_;
  std::vector<Value*> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Value*> memo_;
};

}  // namespace wan::pickle
