// The one place a failed CUDA / cuBLAS / cuDNN / NCCL call becomes a wan::Error naming the statement,
// the library's message and code, and the function, file and line (the check macros of check.h call it).
#include "kernels/check.h"

#include <cstring>

namespace wan::cuda_detail {
void fail(const char* lib, const char* stmt, const char* msg, long code, const char* func, const char* file,
          int line) {
  // Out of device memory is a request too large for the device (exit 2, as a plan that does not fit),
  // not a bug; the plans should have refused it first, so the statement is still named.
  const bool oom = (std::strcmp(lib, "CUDA") == 0 && code == cudaErrorMemoryAllocation)
#ifdef WAN_HAVE_CUBLAS_HEADER
                   || (std::strcmp(lib, "cuBLAS") == 0 && code == CUBLAS_STATUS_ALLOC_FAILED)
#endif
#ifdef WAN_HAVE_CUDNN_HEADER
                   || (std::strcmp(lib, "cuDNN") == 0 && code == CUDNN_STATUS_ALLOC_FAILED)
#endif
      ;
  const std::string where = cat(stmt, " [", func, " ", file, ":", line, "]");
  if (oom)
    throw Error(cat("out of GPU memory (", lib, ": ", msg, ") in ", where, ": the request is too large for the device"));
  throw Error(cat(lib, " error ", code, " (", msg, ") in ", where), ErrorKind::Internal);
}
#ifdef WAN_HAVE_CUBLAS_HEADER
const char* cublas_status_string(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case CUBLAS_STATUS_MAPPING_ERROR: return "mapping error";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "unknown cuBLAS status";
  }
}
#endif
}  // namespace wan::cuda_detail
