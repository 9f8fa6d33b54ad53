// cuDNN convolutions of the VAE encoder and decoder (internal to vae_gpu*.cpp): channels-last bf16
// tensors, bf16 filters [K, (kt,) kh, kw, C], fp32 compute, symmetric zero padding in space (none in
// time), strides in time (3-D) and space, through cuDNN's convolution API.
// One plan (descriptors + algorithm + workspace size) per ConvShape, made on first sight: from cuDNN's
// heuristic order (first deterministic algorithm within the workspace limit: reproducible) or, in find
// mode, from timing every algorithm once on real buffers (fastest deterministic one).
// Invariants: a shape must be prepared (and, in find mode, found) before run(); run() only launches.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace wan::cuda::vae_detail {

struct ConvShape {
  bool is3d = false;     // 3-D: input [D, H, W, C] (one sample); 2-D: input [N, H, W, C]
  int64_t n = 1, d = 1;  // 2-D batch / 3-D depth
  int64_t h = 1, w = 1, c = 1, k = 1;
  int kt = 1, kh = 1, kw = 1, ph = 0, pw = 0;  // time padding is always 0 (the caller stages it)
  int st = 1, ss = 1;                          // strides: time (3-D only), height and width
  bool operator==(const ConvShape&) const = default;
  int64_t out_frames() const { return is3d ? (d - kt) / st + 1 : n; }
  int64_t out_h() const { return (h + 2 * ph - kh) / ss + 1; }
  int64_t out_w() const { return (w + 2 * pw - kw) / ss + 1; }
  double flops() const {
    return 2.0 * static_cast<double>(out_frames() * out_h() * out_w()) * static_cast<double>(k) *
           static_cast<double>(c * kt * kh * kw);
  }
  std::string str() const;
};

class ConvRunner {
 public:
  ConvRunner(bool find, size_t workspace_limit);
  ~ConvRunner();
  ConvRunner(const ConvRunner&) = delete;
  ConvRunner& operator=(const ConvRunner&) = delete;

  // Plans `s` if new and returns the workspace it needs (the limit until an algorithm is chosen:
  // choose() in heuristic mode, find() in find mode).
  size_t prepare(const ConvShape& s);
  // Heuristic mode: picks the algorithm of every prepared shape that has none (cuDNN's queries on
  // several threads; choices are kept for the process per device, shape and limit). Find mode: nothing.
  void choose();
  // Find mode: times cuDNN's algorithms on these buffers once per shape and keeps the fastest
  // deterministic one. Buffers are overwritten (y, workspace).
  void find(const ConvShape& s, const void* x, const void* w, void* y, void* ws, size_t ws_bytes);
  // y = conv(x, w) on `stream`.
  void run(const ConvShape& s, const void* x, const void* w, void* y, void* ws, size_t ws_bytes, cudaStream_t stream);

  std::string plans_str() const;   // one line per shape: algorithm, workspace
  std::string find_report() const; // every timed algorithm per shape (find mode)
  size_t max_workspace() const;    // over all chosen plans

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace wan::cuda::vae_detail
