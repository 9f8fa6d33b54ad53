// DType names, sizes and bulk conversions (scalar conversions live in dtype.h).
#include "core/dtype.h"

#include "core/error.h"

namespace wan {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: case DType::I16: return 2;
    case DType::F8E4M3: case DType::F8E5M2: case DType::I8: case DType::U8: case DType::Bool: return 1;
  }
  WAN_THROW_INTERNAL("bad dtype");
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::F8E4M3: return "f8_e4m3fn";
    case DType::F8E5M2: return "f8_e5m2";
    case DType::I64: return "i64";
    case DType::I32: return "i32";
    case DType::I16: return "i16";
    case DType::I8: return "i8";
    case DType::U8: return "u8";
    case DType::Bool: return "bool";
  }
  return "?";
}

namespace {
struct StName {
  const char* s;
  DType t;
};
constexpr StName kSt[] = {{"F32", DType::F32},     {"F64", DType::F64},        {"F16", DType::F16},
                          {"BF16", DType::BF16},   {"F8_E4M3", DType::F8E4M3}, {"F8_E5M2", DType::F8E5M2},
                          {"I64", DType::I64},     {"I32", DType::I32},        {"I16", DType::I16},
                          {"I8", DType::I8},       {"U8", DType::U8},          {"BOOL", DType::Bool}};
}  // namespace

DType dtype_from_safetensors(std::string_view s) {
  for (const auto& e : kSt)
    if (s == e.s) return e.t;
  WAN_THROW("unknown dtype '", s, "'");
}

const char* dtype_to_safetensors(DType t) {
  for (const auto& e : kSt)
    if (e.t == t) return e.s;
  WAN_THROW_INTERNAL("no safetensors name for dtype");
}

bool dtype_is_float(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16 || t == DType::F8E4M3 ||
         t == DType::F8E5M2;
}

void convert_to_f32(DType src_type, const void* src, float* dst, size_t n) {
  switch (src_type) {
    case DType::F32: memcpy(dst, src, n * 4); return;
    case DType::F64: {
      auto* s = static_cast<const double*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case DType::BF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::F16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::F8E4M3: {
      auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f8e4m3_to_f32(s[i]);
      return;
    }
    case DType::F8E5M2: {
      auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f8e5m2_to_f32(s[i]);
      return;
    }
    default: WAN_THROW("cannot convert ", dtype_name(src_type), " to f32");
  }
}

void convert_from_f32(DType dst_type, const float* src, void* dst, size_t n) {
  switch (dst_type) {
    case DType::F32: memcpy(dst, src, n * 4); return;
    case DType::F64: {
      auto* d = static_cast<double*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = src[i];
      return;
    }
    case DType::BF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::F8E4M3: {
      auto* d = static_cast<uint8_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f8e4m3(src[i]);
      return;
    }
    case DType::F8E5M2: {
      auto* d = static_cast<uint8_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f8e5m2(src[i]);
      return;
    }
    default: WAN_THROW("cannot convert f32 to ", dtype_name(dst_type));
  }
}

}  // namespace wan
