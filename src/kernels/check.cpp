// The one place a failed CUDA / cuBLAS / cuDNN / NCCL call becomes a wan::Error naming the statement,
// the library's message and code, and the function, file and line (the check macros of check.h call it).
#include "kernels/check.h"

namespace wan::cuda_detail {
void fail(const char* lib, const char* stmt, const char* msg, long code, const char* func, const char* file,
          int line) {
  throw Error(cat(lib, " error ", code, " (", msg, ") in ", stmt, " [", func, " ", file, ":", line, "]"),
              ErrorKind::Internal);
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
