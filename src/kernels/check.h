// One family of check macros for the CUDA runtime, cuBLAS, cuDNN and NCCL. Each failure throws
// wan::Error (kind Internal) with the failing statement, the library's message, function, file and
// line, so the context travels up to the command line.
#pragma once
#include <cuda_runtime.h>

#include "core/error.h"

#if __has_include(<cublas_v2.h>)
#include <cublas_v2.h>
#define WAN_HAVE_CUBLAS_HEADER 1
#endif
#if __has_include(<cudnn.h>)
#include <cudnn.h>
#define WAN_HAVE_CUDNN_HEADER 1
#endif
#if __has_include(<nccl.h>)
#include <nccl.h>
#define WAN_HAVE_NCCL_HEADER 1
#endif

namespace wan::cuda_detail {
[[noreturn]] void fail(const char* lib, const char* stmt, const char* msg, long code, const char* func,
                       const char* file, int line);
#ifdef WAN_HAVE_CUBLAS_HEADER
const char* cublas_status_string(cublasStatus_t s);
#endif
}  // namespace wan::cuda_detail

#define CUDA_CHECK(stmt)                                                                            \
  do {                                                                                              \
    cudaError_t e_ = (stmt);                                                                        \
    if (e_ != cudaSuccess)                                                                          \
      ::wan::cuda_detail::fail("CUDA", #stmt, cudaGetErrorString(e_), e_, __func__, __FILE__, __LINE__); \
  } while (0)

#ifdef WAN_HAVE_CUBLAS_HEADER
#define CUBLAS_CHECK(stmt)                                                                     \
  do {                                                                                         \
    cublasStatus_t s_ = (stmt);                                                                \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
      ::wan::cuda_detail::fail("cuBLAS", #stmt, ::wan::cuda_detail::cublas_status_string(s_), s_, \
                               __func__, __FILE__, __LINE__);                                  \
  } while (0)
#endif

#ifdef WAN_HAVE_CUDNN_HEADER
#define CUDNN_CHECK(stmt)                                                                             \
  do {                                                                                                \
    cudnnStatus_t s_ = (stmt);                                                                        \
    if (s_ != CUDNN_STATUS_SUCCESS)                                                                   \
      ::wan::cuda_detail::fail("cuDNN", #stmt, cudnnGetErrorString(s_), s_, __func__, __FILE__, __LINE__); \
  } while (0)
#endif

#ifdef WAN_HAVE_NCCL_HEADER
#define NCCL_CHECK(stmt)                                                                              \
  do {                                                                                                \
    ncclResult_t r_ = (stmt);                                                                         \
    if (r_ != ncclSuccess)                                                                            \
      ::wan::cuda_detail::fail("NCCL", #stmt, ncclGetErrorString(r_), r_, __func__, __FILE__, __LINE__); \
  } while (0)
#endif

// Checks the last kernel launch (launch-configuration errors are reported at the launch site).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
