// The LoRA merge on the GPU as the weights stream in: merge hooks for the streaming upload
// (runtime/load_gpu.h LoadTarget::merge, models/weights_gpu.h WeightMergeFn) built from a LoraSet.
// A hook runs on the loader's conversion stream once its tensor is assembled in fp32: it copies the
// target's factors as stored (f32, bf16 or f16; pageable copies from the file's mapping into
// stream-ordered device buffers), runs kernels/lora_merge.h, and frees the buffers stream-ordered, so
// the device holds one tensor's factors at a time besides the work buffers.
// Invariant: the result equals apply_lora_cpu (lora.h) on the same fp32 weight bit for bit; a target
// whose terms all have scale 0 gets no hook (the weight is the base's, bit for bit).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "lora/lora.h"

namespace wan::cuda {

using LoraMergeHook = std::function<void(float* work, cudaStream_t stream)>;
// name -> hook, or an empty function for a tensor the set does not change. Null set: no hooks.
std::function<LoraMergeHook(const std::string& official_name)> lora_merge_hooks(std::shared_ptr<const LoraSet> set);

}  // namespace wan::cuda
