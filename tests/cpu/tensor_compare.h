// Comparing tensors in the CPU tests: a tensor from a safetensors file as f32, and the two error
// measures the oracle tests use, max |a - ref| / max |ref| and max |a - ref| (INFINITY, and a test
// failure, when the shapes differ).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/tensor.h"
#include "formats/safetensors.h"

namespace wan::test {

inline Tensor load_tensor(const std::string& file, const std::string& name) {
  auto f = SafetensorsFile::open(file);
  return f->get(name).to_f32().clone();
}

inline double max_abs(const Tensor& a, const Tensor& ref) {
  EXPECT_EQ(a.shape(), ref.shape());
  if (!(a.shape() == ref.shape())) return INFINITY;
  double d = 0;
  for (int64_t i = 0; i < a.numel(); ++i) d = std::max(d, static_cast<double>(std::fabs(a.f32()[i] - ref.f32()[i])));
  return d;
}

inline double max_rel(const Tensor& a, const Tensor& ref) {
  const double d = max_abs(a, ref);
  double m = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) m = std::max(m, static_cast<double>(std::fabs(ref.f32()[i])));
  return d / m;
}

}  // namespace wan::test
