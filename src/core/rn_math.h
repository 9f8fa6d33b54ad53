// One correctly rounded float32 operation each, the same bits on the host and the device: the _rn
// intrinsics on the device (never contracted into an fma), plain operators on the host (the build
// compiles with -ffp-contract=off). For arithmetic whose CPU reference must match a kernel bit for bit.
#pragma once
#include "core/dtype.h"  // WAN_HD

namespace wan::rn {

WAN_HD float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
WAN_HD float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
WAN_HD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
WAN_HD float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

}  // namespace wan::rn
