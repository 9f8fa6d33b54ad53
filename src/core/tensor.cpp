// Shapes, views and owning host tensors.
#include "core/tensor.h"

#include <cstdlib>
#include <limits>
#include <sstream>

namespace wan {

Shape::Shape(std::initializer_list<int64_t> dims) {
  WAN_ASSERT(dims.size() <= kMaxDims, "too many dims");
  for (int64_t v : dims) d[ndim++] = v;
}
Shape::Shape(const std::vector<int64_t>& dims) {
  WAN_CHECK(dims.size() <= kMaxDims, "tensor has ", dims.size(), " dims (at most ", kMaxDims, " supported)");
  for (int64_t v : dims) d[ndim++] = v;
}
int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= d[i];
  return n;
}
std::string Shape::str() const {
  std::ostringstream os;
  os << '[';
  for (int i = 0; i < ndim; ++i) os << (i ? ", " : "") << d[i];
  os << ']';
  return os.str();
}
bool Shape::operator==(const Shape& o) const {
  if (ndim != o.ndim) return false;
  for (int i = 0; i < ndim; ++i)
    if (d[i] != o.d[i]) return false;
  return true;
}

TensorView::TensorView(void* p, DType t, Shape s, Device dev) : data(p), dtype(t), shape(s), device(dev) {
  int64_t st = 1;
  for (int i = s.ndim - 1; i >= 0; --i) {
    stride[i] = st;
    st *= s.d[i];
  }
}
bool TensorView::is_contiguous() const {
  int64_t st = 1;
  for (int i = shape.ndim - 1; i >= 0; --i) {
    if (shape.d[i] != 1 && stride[i] != st) return false;
    st *= shape.d[i];
  }
  return true;
}

std::shared_ptr<void> aligned_alloc_shared(size_t bytes, size_t align) {
  size_t rounded = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded == 0 ? align : rounded);
  if (!p) WAN_THROW("out of host memory allocating ", bytes, " bytes");
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

Tensor Tensor::empty(DType t, Shape s) {
  Tensor r;
  WAN_CHECK(s.numel() >= 0, "negative tensor size ", s.str());
  size_t bytes = static_cast<size_t>(s.numel()) * dtype_size(t);
  auto mem = aligned_alloc_shared(bytes);
  r.v_ = TensorView(mem.get(), t, s);
  r.owner_ = std::move(mem);
  return r;
}
Tensor::Tensor(DType t, Shape s) {
  *this = empty(t, s);
  if (nbytes()) memset(v_.data, 0, nbytes());
}
Tensor Tensor::borrow(std::shared_ptr<const void> owner, const void* data, DType t, Shape s) {
  Tensor r;
  r.owner_ = std::move(owner);
  r.v_ = TensorView(const_cast<void*>(data), t, s);
  return r;
}
Tensor Tensor::reshape(Shape s) const {
  WAN_CHECK(s.numel() == numel(), "cannot reshape ", shape().str(), " to ", s.str());
  Tensor r = *this;
  r.v_ = TensorView(v_.data, v_.dtype, s, v_.device);
  return r;
}
Tensor Tensor::to_f32() const {
  if (v_.dtype == DType::F32) return *this;
  return to(DType::F32);
}
Tensor Tensor::to(DType t) const {
  Tensor r = empty(t, shape());
  size_t n = static_cast<size_t>(numel());
  if (t == v_.dtype) {
    memcpy(r.data(), data(), nbytes());
  } else if (t == DType::F32) {
    convert_to_f32(v_.dtype, data(), r.f32(), n);
  } else {
    Tensor tmp = to_f32();
    convert_from_f32(t, tmp.f32(), r.data(), n);
  }
  return r;
}
Tensor Tensor::clone() const { return to(v_.dtype); }

}  // namespace wan
