// Restricted pickle interpreter for torch.save state dicts (see pickle.h for the rules).
// Opcode semantics follow CPython's Lib/pickle.py (_Unpickler); what torch puts in data.pkl was
// checked with pickletools.dis on files written by torch 2.x: protocol 2, OrderedDict via
// GLOBAL + EMPTY_TUPLE + REDUCE, tensors via _rebuild_tensor_v2(persistent storage, offset, size,
// stride, requires_grad, OrderedDict()), float8 tensors via _rebuild_tensor_v3 over an
// UntypedStorage (numel in bytes) with a torch.<dtype> argument, and a state dict's `_metadata`
// attribute via BUILD with a dict state (an attribute, not items: it is dropped).
#include "formats/pickle.h"

#include <cstring>

#include "core/error.h"
#include "core/tensor.h"

namespace wan::pickle {
namespace {

struct NamedDType {
  const char* name;
  DType dtype;
};
// torch.<Name>Storage classes (legacy typed storages that torch.save still names).
constexpr NamedDType kStorageTypes[] = {
    {"FloatStorage", DType::F32}, {"DoubleStorage", DType::F64}, {"HalfStorage", DType::F16},
    {"BFloat16Storage", DType::BF16}, {"LongStorage", DType::I64}, {"IntStorage", DType::I32},
    {"ShortStorage", DType::I16}, {"CharStorage", DType::I8}, {"ByteStorage", DType::U8},
    {"BoolStorage", DType::Bool},
};
// torch.<dtype> objects (canonical names and their aliases).
constexpr NamedDType kDTypes[] = {
    {"float32", DType::F32}, {"float", DType::F32}, {"float64", DType::F64}, {"double", DType::F64},
    {"float16", DType::F16}, {"half", DType::F16}, {"bfloat16", DType::BF16}, {"int64", DType::I64},
    {"long", DType::I64}, {"int32", DType::I32}, {"int", DType::I32}, {"int16", DType::I16},
    {"short", DType::I16}, {"int8", DType::I8}, {"uint8", DType::U8}, {"bool", DType::Bool},
    {"float8_e4m3fn", DType::F8E4M3}, {"float8_e5m2", DType::F8E5M2},
};

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::None: return "None";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::Str: return "str";
    case Kind::Bytes: return "bytes";
    case Kind::Tuple: return "tuple";
    case Kind::List: return "list";
    case Kind::Dict: return "dict";
    case Kind::Callable: return "callable";
    case Kind::StorageType: return "storage type";
    case Kind::DTypeObj: return "dtype";
    case Kind::Storage: return "storage";
    case Kind::Tensor: return "tensor";
  }
  return "?";
}

}  // namespace

Unpickler::Unpickler(const uint8_t* data, size_t size, std::string what)
    : data_(data), size_(size), what_(std::move(what)) {}

void Unpickler::fail(const std::string& msg) const { WAN_THROW(what_, ": ", msg); }

Value* Unpickler::make(Kind k) {
  arena_.push_back(std::make_unique<Value>());
  arena_.back()->kind = k;
  return arena_.back().get();
}

Value* Unpickler::pop() {
  size_t floor = marks_.empty() ? 0 : marks_.back();
  if (stack_.size() <= floor) fail(cat("malformed pickle: stack underflow at byte ", pos_));
  Value* v = stack_.back();
  stack_.pop_back();
  return v;
}

std::vector<Value*> Unpickler::pop_mark() {
  if (marks_.empty()) fail(cat("malformed pickle: no MARK before byte ", pos_));
  size_t m = marks_.back();
  marks_.pop_back();
  std::vector<Value*> items(stack_.begin() + static_cast<ptrdiff_t>(m), stack_.end());
  stack_.resize(m);
  return items;
}

const uint8_t* Unpickler::take(size_t n) {
  if (n > size_ - pos_) fail(cat("truncated pickle: needs ", n, " more bytes at byte ", pos_, " of ", size_));
  const uint8_t* p = data_ + pos_;
  pos_ += n;
  return p;
}

Value* Unpickler::global(const std::string& module, const std::string& name) {
  std::string full = module + "." + name;
  Value* v = nullptr;
  auto callable = [&](Fn fn) {
    v = make(Kind::Callable);
    v->fn = fn;
  };
  if (full == "collections.OrderedDict") {
    callable(Fn::OrderedDict);
  } else if (full == "torch._utils._rebuild_tensor_v2") {
    callable(Fn::RebuildTensorV2);
  } else if (full == "torch._utils._rebuild_tensor_v3") {
    callable(Fn::RebuildTensorV3);
  } else if (full == "torch._utils._rebuild_parameter") {
    callable(Fn::RebuildParameter);
  } else if (full == "torch._utils._rebuild_parameter_with_state") {
    callable(Fn::RebuildParameterWithState);
  } else if (full == "torch.storage.UntypedStorage" || full == "torch.UntypedStorage") {
    v = make(Kind::StorageType);
    v->typed = false;
    v->dtype = DType::U8;
  } else if (module == "torch") {
    for (const auto& [n, t] : kStorageTypes) {
      if (name == n) {
        v = make(Kind::StorageType);
        v->dtype = t;
      }
    }
    for (const auto& [n, t] : kDTypes) {
      if (name == n) {
        v = make(Kind::DTypeObj);
        v->dtype = t;
      }
    }
  }
  if (!v) fail(cat("refused pickle global '", full, "' (only tensor state dicts are read)"));
  v->s = full;
  return v;
}

// Interprets a call of a whitelisted callable; the argument kinds are checked, nothing is run.
Value* Unpickler::reduce(Value* callable, Value* args) {
  if (callable->kind != Kind::Callable)
    fail(cat("refused pickle call of ", kind_name(callable->kind), " '", callable->s,
             "' (only tensor state dicts are read)"));
  if (args->kind != Kind::Tuple) fail(cat("malformed pickle: REDUCE arguments are not a tuple at byte ", pos_));
  const std::vector<Value*>& a = args->items;
  auto arg = [&](size_t i, Kind k) -> Value* {
    if (a[i]->kind != k)
      fail(cat(callable->s, ": argument ", i, " is a ", kind_name(a[i]->kind), ", expected a ", kind_name(k)));
    return a[i];
  };
  auto int_tuple = [&](size_t i) {
    std::vector<int64_t> out;
    for (const Value* x : arg(i, Kind::Tuple)->items) {
      if (x->kind != Kind::Int || x->i < 0)
        fail(cat(callable->s, ": argument ", i, " must be a tuple of non-negative ints"));
      out.push_back(x->i);
    }
    return out;
  };
  switch (callable->fn) {
    case Fn::OrderedDict: {
      if (!a.empty()) fail("collections.OrderedDict: only the empty constructor is supported");
      return make_dict();
    }
    case Fn::RebuildTensorV2:
    case Fn::RebuildTensorV3: {
      bool v3 = callable->fn == Fn::RebuildTensorV3;
      // v2: (storage, offset, size, stride, requires_grad, hooks[, metadata]);
      // v3: (storage, offset, size, stride, requires_grad, hooks, dtype[, metadata]).
      size_t base = v3 ? 7 : 6;
      if (a.size() != base && a.size() != base + 1)
        fail(cat(callable->s, ": expected ", base, " or ", base + 1, " arguments, got ", a.size()));
      Value* t = make(Kind::Tensor);
      t->storage = arg(0, Kind::Storage);
      t->storage_offset = arg(1, Kind::Int)->i;
      if (t->storage_offset < 0) fail(cat(callable->s, ": negative storage offset"));
      t->size = int_tuple(2);
      t->stride = int_tuple(3);
      if (t->size.size() != t->stride.size())
        fail(cat(callable->s, ": size has ", t->size.size(), " dims but stride has ", t->stride.size()));
      if (t->size.size() > static_cast<size_t>(kMaxDims))
        fail(cat(callable->s, ": tensor has ", t->size.size(), " dims (at most ", kMaxDims, " supported)"));
      arg(4, Kind::Bool);
      arg(5, Kind::Dict);
      t->dtype = v3 ? arg(6, Kind::DTypeObj)->dtype : t->storage->dtype;
      if (a.size() == base + 1 && a[base]->kind != Kind::None && a[base]->kind != Kind::Dict)
        fail(cat(callable->s, ": tensor metadata is a ", kind_name(a[base]->kind)));
      return t;
    }
    case Fn::RebuildParameter:
    case Fn::RebuildParameterWithState: {
      size_t n = callable->fn == Fn::RebuildParameter ? 3 : 4;
      if (a.size() != n) fail(cat(callable->s, ": expected ", n, " arguments, got ", a.size()));
      arg(1, Kind::Bool);
      arg(2, Kind::Dict);
      return arg(0, Kind::Tensor);  // a Parameter is its data for reading purposes
    }
  }
  fail("internal: unknown callable");
}

void Unpickler::set_item(Value* dict, Value* key, Value* value) {
  if (dict->kind != Kind::Dict) fail(cat("malformed pickle: SETITEM on a ", kind_name(dict->kind)));
  std::string k;
  switch (key->kind) {
    case Kind::Str: k = "s" + key->s; break;
    case Kind::Int: k = "i" + std::to_string(key->i); break;
    case Kind::Bool: k = key->b ? "i1" : "i0"; break;  // Python: True == 1
    case Kind::None: k = "n"; break;
    default: fail(cat("unsupported dict key of type ", kind_name(key->kind)));
  }
  auto [it, fresh] = dict->dict_index->emplace(k, dict->dict.size());
  if (fresh) {
    dict->dict.emplace_back(key, value);
  } else {
    dict->dict[it->second].second = value;
  }
}

Value* Unpickler::make_dict() {
  Value* d = make(Kind::Dict);
  d->dict_index = std::make_unique<std::unordered_map<std::string, size_t>>();
  return d;
}

uint64_t Unpickler::take_uint(size_t width) {
  const uint8_t* p = take(width);
  uint64_t n = 0;
  for (size_t i = width; i-- > 0;) n = (n << 8) | p[i];
  return n;
}

// One "module" or "name" line of GLOBAL, bounded so that a missing newline cannot grow it unchecked.
std::string Unpickler::take_line(size_t at) {
  std::string s;
  for (;;) {
    char ch = static_cast<char>(*take(1));
    if (ch == '\n') break;
    if (s.size() >= 256) fail(cat("malformed pickle: GLOBAL name too long at byte ", at));
    s.push_back(ch);
  }
  return s;
}

bool Unpickler::framing_op(uint8_t op) {
  switch (op) {
    case 0x80: {  // PROTO
      uint8_t proto = *take(1);
      if (proto > 5) fail(cat("unsupported pickle protocol ", int(proto)));
      return true;
    }
    case 0x95:  // FRAME: a length hint only
      take(8);
      return true;
    default:
      return false;
  }
}

bool Unpickler::stack_op(uint8_t op, size_t at) {
  switch (op) {
    case '(':  // MARK
      if (marks_.size() >= kMaxMarkDepth) fail(cat("pickle nesting deeper than ", kMaxMarkDepth, " levels"));
      marks_.push_back(stack_.size());
      return true;
    case 'q':
    case 'r':
    case 0x94: {  // BINPUT, LONG_BINPUT, MEMOIZE
      const uint64_t idx = op == 'q' ? take_uint(1) : op == 'r' ? take_uint(4) : memo_.size();
      if (stack_.empty() || stack_.size() <= (marks_.empty() ? 0 : marks_.back()))
        fail(cat("malformed pickle: memo store from an empty stack at byte ", at));
      memo_[idx] = stack_.back();
      return true;
    }
    case 'h':
    case 'j': {  // BINGET, LONG_BINGET
      const uint64_t idx = take_uint(op == 'h' ? 1 : 4);
      auto it = memo_.find(idx);
      if (it == memo_.end()) fail(cat("malformed pickle: memo key ", idx, " not found at byte ", at));
      stack_.push_back(it->second);
      return true;
    }
    default:
      return false;
  }
}

bool Unpickler::string_op(uint8_t op, size_t at) {
  size_t width = 0;  // of the length prefix
  bool bytes = false;
  switch (op) {
    case 'X': width = 4; break;                  // BINUNICODE
    case 0x8c: width = 1; break;                 // SHORT_BINUNICODE
    case 0x8d: width = 8; break;                 // BINUNICODE8
    case 'B': width = 4; bytes = true; break;   // BINBYTES
    case 'C': width = 1; bytes = true; break;   // SHORT_BINBYTES
    case 0x8e: width = 8; bytes = true; break;  // BINBYTES8
    default: return false;
  }
  const uint64_t n = take_uint(width);
  if (n > size_ - pos_) fail(cat("truncated pickle: string of ", n, " bytes at byte ", at));
  Value* v = make(bytes ? Kind::Bytes : Kind::Str);
  const uint8_t* s = take(static_cast<size_t>(n));
  v->s.assign(reinterpret_cast<const char*>(s), static_cast<size_t>(n));
  stack_.push_back(v);
  return true;
}

bool Unpickler::number_op(uint8_t op, size_t at) {
  Value* v = nullptr;
  switch (op) {
    case 'J':  // BININT: signed 32-bit
    case 'K':  // BININT1
    case 'M': {  // BININT2
      const uint64_t u = take_uint(op == 'J' ? 4 : op == 'K' ? 1 : 2);
      v = make(Kind::Int);
      v->i = op == 'J' ? static_cast<int32_t>(static_cast<uint32_t>(u)) : static_cast<int64_t>(u);
      break;
    }
    case 0x8a: {  // LONG1: little-endian two's complement of n bytes
      size_t n = *take(1);
      if (n > 8) fail(cat("pickle integer of ", n, " bytes is too large at byte ", at));
      const uint8_t* p = take(n);
      uint64_t u = 0;
      for (size_t i = n; i-- > 0;) u = (u << 8) | p[i];
      if (n > 0 && n < 8 && (p[n - 1] & 0x80)) u |= ~uint64_t{0} << (8 * n);  // sign-extend
      v = make(Kind::Int);
      v->i = static_cast<int64_t>(u);
      break;
    }
    case 0x88:
    case 0x89:  // NEWTRUE, NEWFALSE
      v = make(Kind::Bool);
      v->b = op == 0x88;
      break;
    case 'N':  // NONE
      v = make(Kind::None);
      break;
    case 'G': {  // BINFLOAT: big-endian double
      const uint8_t* p = take(8);
      uint64_t u = 0;
      for (int i = 0; i < 8; ++i) u = (u << 8) | p[i];
      v = make(Kind::Float);
      std::memcpy(&v->f, &u, 8);
      break;
    }
    default:
      return false;
  }
  stack_.push_back(v);
  return true;
}

bool Unpickler::container_op(uint8_t op, size_t at) {
  switch (op) {
    case '}':  // EMPTY_DICT
      stack_.push_back(make_dict());
      return true;
    case ']':  // EMPTY_LIST
      stack_.push_back(make(Kind::List));
      return true;
    case ')':  // EMPTY_TUPLE
      stack_.push_back(make(Kind::Tuple));
      return true;
    case 't': {  // TUPLE
      Value* t = make(Kind::Tuple);
      t->items = pop_mark();
      stack_.push_back(t);
      return true;
    }
    case 0x85:
    case 0x86:
    case 0x87: {  // TUPLE1..3
      Value* t = make(Kind::Tuple);
      t->items.resize(op - 0x84);
      for (size_t i = t->items.size(); i-- > 0;) t->items[i] = pop();
      stack_.push_back(t);
      return true;
    }
    case 's': {  // SETITEM
      Value* value = pop();
      Value* key = pop();
      if (stack_.empty()) fail(cat("malformed pickle: SETITEM without a dict at byte ", at));
      set_item(stack_.back(), key, value);
      return true;
    }
    case 'u': {  // SETITEMS
      std::vector<Value*> kv = pop_mark();
      if (kv.size() % 2) fail(cat("malformed pickle: odd SETITEMS count at byte ", at));
      if (stack_.empty()) fail(cat("malformed pickle: SETITEMS without a dict at byte ", at));
      for (size_t i = 0; i < kv.size(); i += 2) set_item(stack_.back(), kv[i], kv[i + 1]);
      return true;
    }
    case 'a':
    case 'e': {  // APPEND, APPENDS
      std::vector<Value*> xs;
      if (op == 'a') {
        xs.push_back(pop());
      } else {
        xs = pop_mark();
      }
      if (stack_.empty() || stack_.back()->kind != Kind::List)
        fail(cat("malformed pickle: APPEND to a non-list at byte ", at));
      auto& items = stack_.back()->items;
      items.insert(items.end(), xs.begin(), xs.end());
      return true;
    }
    default:
      return false;
  }
}

// BUILD: an OrderedDict's state is its instance __dict__ (state_dict()._metadata) or
// (dict_state, slot_state): attributes, not items, so dropping it keeps the tensors intact.
void Unpickler::build(Value* state, size_t at) {
  if (stack_.empty()) fail(cat("malformed pickle: BUILD without an object at byte ", at));
  Value* obj = stack_.back();
  auto attrs_ok = [](const Value* s) { return s->kind == Kind::None || s->kind == Kind::Dict; };
  bool ok = obj->kind == Kind::Dict &&
            (attrs_ok(state) || (state->kind == Kind::Tuple && state->items.size() == 2 &&
                                 attrs_ok(state->items[0]) && attrs_ok(state->items[1])));
  if (!ok)
    fail(cat("refused pickle BUILD of a ", kind_name(obj->kind), " with a ", kind_name(state->kind),
             " state (only tensor state dicts are read)"));
}

// BINPERSID: ("storage", storage_type, key, location, numel) becomes a Storage value.
Value* Unpickler::persistent_storage(Value* pid, size_t at) {
  const auto& it = pid->items;
  bool ok = pid->kind == Kind::Tuple && it.size() == 5 && it[0]->kind == Kind::Str && it[0]->s == "storage" &&
            it[1]->kind == Kind::StorageType && it[2]->kind == Kind::Str && it[3]->kind == Kind::Str &&
            it[4]->kind == Kind::Int && it[4]->i >= 0;
  if (!ok)
    fail(cat("refused pickle persistent id at byte ", at,
             " (expected (\"storage\", storage type, key, location, numel))"));
  Value* st = make(Kind::Storage);
  st->typed = it[1]->typed;
  st->dtype = it[1]->dtype;
  st->s = it[2]->s;
  st->numel = it[4]->i;
  return st;
}

// Globals, calls, object state and persistent ids: only interpreted through the whitelists of
// global() and reduce(), never run.
bool Unpickler::object_op(uint8_t op, size_t at) {
  switch (op) {
    case 'c': {  // GLOBAL: "module\nname\n"
      std::string module = take_line(at);
      std::string name = take_line(at);
      stack_.push_back(global(module, name));
      return true;
    }
    case 0x93: {  // STACK_GLOBAL
      Value* name = pop();
      Value* module = pop();
      if (name->kind != Kind::Str || module->kind != Kind::Str)
        fail(cat("malformed pickle: STACK_GLOBAL needs two strings at byte ", at));
      stack_.push_back(global(module->s, name->s));
      return true;
    }
    case 'R': {  // REDUCE
      Value* args = pop();
      Value* fn = pop();
      stack_.push_back(reduce(fn, args));
      return true;
    }
    case 'b':  // BUILD
      build(pop(), at);
      return true;
    case 'Q':  // BINPERSID
      stack_.push_back(persistent_storage(pop(), at));
      return true;
    default:
      return false;
  }
}

const Value* Unpickler::load() {
  for (;;) {
    const size_t at = pos_;
    const uint8_t op = *take(1);
    if (op == '.') {  // STOP
      if (stack_.size() != 1 || !marks_.empty())
        fail(cat("malformed pickle: STOP with ", stack_.size(), " values on the stack"));
      return stack_.back();
    }
    // The families take disjoint opcodes; one that none takes is refused.
    if (framing_op(op) || stack_op(op, at) || string_op(op, at) || number_op(op, at) || container_op(op, at) ||
        object_op(op, at))
      continue;
    static const char* hex = "0123456789abcdef";
    fail(cat("refused pickle opcode 0x", hex[op >> 4], hex[op & 15], " at byte ", at,
             " (only tensor state dicts are read)"));
  }
}

}  // namespace wan::pickle
