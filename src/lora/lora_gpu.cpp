// lora_merge_hooks (lora_gpu.h): one hook per active target, factors uploaded as stored per merge, on
// an upload stream of the hook set's own.
#include "lora/lora_gpu.h"

#include <algorithm>
#include <deque>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "kernels/check.h"
#include "kernels/lora_merge.h"

namespace wan::cuda {
namespace {

// A contiguous host tensor of a factor dtype the kernel reads (else widened to f32 first).
Tensor kernel_ready(const Tensor& t) {
  const DType d = t.dtype();
  if ((d == DType::F32 || d == DType::BF16 || d == DType::F16) && t.view().is_contiguous()) return t;
  return t.to_f32();
}

// The factors' host-to-device copies run on a stream of their own: a copy from pageable memory on
// the merge stream would wait for that stream's earlier work (the previous merges, a random draw)
// before staging, so the host and the device would take turns instead of overlapping.
// At most kInFlight targets' factors are on the device at once: the host waits for the oldest merge
// before uploading more, so the upload stream never runs far ahead of the merges.
constexpr size_t kInFlight = 8;

struct Uploads {
  std::mutex mu;
  int device = -1;
  cudaStream_t stream = nullptr;
  std::deque<cudaEvent_t> merged;  // recorded on the merge streams after each target's merge
  ~Uploads() {
    for (cudaEvent_t e : merged) cudaEventDestroy(e);
    if (stream) cudaStreamDestroy(stream);  // deferred until its work is done; never synchronises
  }
  void throttle() {
    while (merged.size() >= kInFlight) {
      CUDA_CHECK(cudaEventSynchronize(merged.front()));
      CUDA_CHECK(cudaEventDestroy(merged.front()));
      merged.pop_front();
    }
  }
  void done(cudaStream_t s) {
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    merged.push_back(e);
    CUDA_CHECK(cudaEventRecord(e, s));
  }
  cudaStream_t get() {
    int d = 0;
    CUDA_CHECK(cudaGetDevice(&d));
    if (stream && d != device) {
      cudaStreamDestroy(stream);
      stream = nullptr;
    }
    if (!stream) CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    device = d;
    return stream;
  }
};

void merge_target(const LoraTarget& t, void* w, DType w_dtype, cudaStream_t s, Uploads& up) {
  std::lock_guard<std::mutex> lock(up.mu);
  const cudaStream_t u = up.get();
  up.throttle();
  std::vector<Tensor> keep;  // host tensors alive until their (pageable, so staged) copies are enqueued
  for (const LoraLowRank& lr : t.low_rank)
    if (lr.scale != 0.0f) keep.push_back(kernel_ready(lr.up)), keep.push_back(kernel_ready(lr.down));
  for (const LoraFull& f : t.full)
    if (f.scale != 0.0f) keep.push_back(kernel_ready(f.delta));
  // One device buffer for all of the target's factors, 256-byte aligned each.
  std::vector<size_t> off;
  size_t total = 0;
  for (const Tensor& k : keep) {
    off.push_back(total);
    total += (static_cast<size_t>(k.numel()) * dtype_size(k.dtype()) + 255) / 256 * 256;
  }
  char* buf = nullptr;
  CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&buf), std::max<size_t>(total, 256), u));
  for (size_t i = 0; i < keep.size(); ++i)
    if (keep[i].numel())
      CUDA_CHECK(cudaMemcpyAsync(buf + off[i], keep[i].data(), static_cast<size_t>(keep[i].numel()) *
                                 dtype_size(keep[i].dtype()), cudaMemcpyHostToDevice, u));
  cudaEvent_t copied = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(copied, u));
  CUDA_CHECK(cudaStreamWaitEvent(s, copied, 0));
  CUDA_CHECK(cudaEventDestroy(copied));
  std::vector<LoraTermDev> terms;
  std::vector<DiffTermDev> diffs;
  size_t k = 0;
  for (const LoraLowRank& lr : t.low_rank) {
    if (lr.scale == 0.0f) continue;
    terms.push_back({buf + off[k], buf + off[k + 1], keep[k].dtype(), keep[k + 1].dtype(), static_cast<int>(lr.rank()),
                     lr.scale});
    k += 2;
  }
  for (const LoraFull& f : t.full) {
    if (f.scale == 0.0f) continue;
    diffs.push_back({buf + off[k], keep[k].dtype(), f.scale});
    ++k;
  }
  WAN_WITH_CONTEXT(cat("LoRA merge into ", t.name),
                   lora_merge(w, w_dtype, t.rows, t.cols, terms.data(), static_cast<int>(terms.size()), diffs.data(),
                              static_cast<int>(diffs.size()), s));
  CUDA_CHECK(cudaFreeAsync(buf, s));
  up.done(s);
}

}  // namespace

std::function<LoraMergeHook(const std::string&)> lora_merge_hooks(std::shared_ptr<const LoraSet> set) {
  if (!set || set->empty()) return {};
  auto up = std::make_shared<Uploads>();
  return [set, up](const std::string& name) -> LoraMergeHook {
    const LoraTarget* t = set->find(name);
    if (!t || !t->active()) return {};
    return [set, t, up](void* w, DType dt, cudaStream_t s) { merge_target(*t, w, dt, s, *up); };
  };
}

}  // namespace wan::cuda
