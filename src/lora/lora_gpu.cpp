// lora_merge_hooks (lora_gpu.h): one hook per active target, factors uploaded as stored per merge.
#include "lora/lora_gpu.h"

#include <algorithm>
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

// Copies a host tensor into a stream-ordered device buffer (freed by the caller's cudaFreeAsync).
void* upload(const Tensor& t, cudaStream_t s, std::vector<void*>& owned) {
  const size_t bytes = static_cast<size_t>(t.numel()) * dtype_size(t.dtype());
  void* d = nullptr;
  CUDA_CHECK(cudaMallocAsync(&d, std::max<size_t>(bytes, 16), s));
  owned.push_back(d);
  if (bytes) CUDA_CHECK(cudaMemcpyAsync(d, t.data(), bytes, cudaMemcpyHostToDevice, s));
  return d;
}

void merge_target(const LoraTarget& t, float* work, cudaStream_t s) {
  std::vector<void*> owned;
  std::vector<Tensor> keep;  // host tensors alive until their (pageable, so staged) copies are enqueued
  std::vector<LoraTermDev> terms;
  std::vector<DiffTermDev> diffs;
  for (const LoraLowRank& lr : t.low_rank) {
    if (lr.scale == 0.0f) continue;
    keep.push_back(kernel_ready(lr.up));
    keep.push_back(kernel_ready(lr.down));
    const Tensor& up = keep[keep.size() - 2];
    const Tensor& down = keep.back();
    terms.push_back({upload(up, s, owned), upload(down, s, owned), up.dtype(), down.dtype(),
                     static_cast<int>(lr.rank()), lr.scale});
  }
  for (const LoraFull& f : t.full) {
    if (f.scale == 0.0f) continue;
    keep.push_back(kernel_ready(f.delta));
    diffs.push_back({upload(keep.back(), s, owned), keep.back().dtype(), f.scale});
  }
  WAN_WITH_CONTEXT(cat("LoRA merge into ", t.name),
                   lora_merge_f32(work, t.rows, t.cols, terms.data(), static_cast<int>(terms.size()), diffs.data(),
                                  static_cast<int>(diffs.size()), s));
  for (void* p : owned) CUDA_CHECK(cudaFreeAsync(p, s));
}

}  // namespace

std::function<LoraMergeHook(const std::string&)> lora_merge_hooks(std::shared_ptr<const LoraSet> set) {
  if (!set || set->empty()) return {};
  return [set](const std::string& name) -> LoraMergeHook {
    const LoraTarget* t = set->find(name);
    if (!t || !t->active()) return {};
    return [set, t](float* work, cudaStream_t s) { merge_target(*t, work, s); };
  };
}

}  // namespace wan::cuda
