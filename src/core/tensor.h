// Tensor views and owning host tensors.
// TensorView is a non-owning (pointer, dtype, shape, strides, device) record; strides are in
// elements. Tensor owns a 64-byte-aligned host buffer (or wraps external memory kept alive by a
// shared_ptr, e.g. a memory-mapped checkpoint) and hands out views.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace wan {

enum class DeviceType : uint8_t { CPU, CUDA };
struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool operator==(const Device&) const = default;
};

constexpr int kMaxDims = 8;

struct Shape {
  int ndim = 0;
  std::array<int64_t, kMaxDims> d{};
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(const std::vector<int64_t>& dims);
  int64_t operator[](int i) const { return d[i < 0 ? i + ndim : i]; }
  int64_t& operator[](int i) { return d[i < 0 ? i + ndim : i]; }
  int64_t numel() const;
  std::vector<int64_t> vec() const { return {d.begin(), d.begin() + ndim}; }
  std::string str() const;  // "[2, 3, 4]"
  bool operator==(const Shape& o) const;
};

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape;
  std::array<int64_t, kMaxDims> stride{};  // in elements
  Device device;

  TensorView() = default;
  TensorView(void* p, DType t, Shape s, Device dev = {});  // contiguous strides
  int ndim() const { return shape.ndim; }
  int64_t numel() const { return shape.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;
  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
};

// Owning tensor on the host (aligned storage), or a typed handle on borrowed memory.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType t, Shape s);  // allocates, zero-filled
  static Tensor empty(DType t, Shape s);  // allocates, uninitialised
  static Tensor f32(Shape s) { return Tensor(DType::F32, s); }
  // Wraps memory owned by `owner` (e.g. an mmap); no copy.
  static Tensor borrow(std::shared_ptr<const void> owner, const void* data, DType t, Shape s);

  const TensorView& view() const { return v_; }
  DType dtype() const { return v_.dtype; }
  const Shape& shape() const { return v_.shape; }
  int64_t dim(int i) const { return v_.shape[i]; }
  int ndim() const { return v_.shape.ndim; }
  int64_t numel() const { return v_.numel(); }
  size_t nbytes() const { return v_.nbytes(); }
  bool defined() const { return v_.data != nullptr || (numel() == 0 && owner_ != nullptr); }
  void* data() const { return v_.data; }
  float* f32() const {
    WAN_ASSERT(v_.dtype == DType::F32, "tensor is ", dtype_name(v_.dtype));
    return static_cast<float*>(v_.data);
  }
  // Same storage, new shape (numel must match).
  Tensor reshape(Shape s) const;
  // Copy converted to f32 (or a shared handle if already f32 and contiguous).
  Tensor to_f32() const;
  // Copy converted to dtype t.
  Tensor to(DType t) const;
  Tensor clone() const;

 private:
  std::shared_ptr<const void> owner_;
  TensorView v_;
};

// 64-byte aligned host allocation (for SIMD, pinned-like staging); freed by the deleter.
std::shared_ptr<void> aligned_alloc_shared(size_t bytes, size_t align = 64);

}  // namespace wan
