// The LoRA merge on the GPU as the weights stream in: merge hooks for the streaming upload
// (runtime/load_gpu.h LoadTarget::merge, models/weights_gpu.h WeightMergeFn) built from a LoraSet.
// A hook runs on the loader's conversion stream once its tensor is assembled in fp32 (or on a random
// draw's stream, in place): it copies the target's factors as stored (f32, bf16 or f16; pageable
// copies from the file's mapping, on an upload stream of its own, into one stream-ordered device
// buffer), runs kernels/lora_merge.h after them, and frees the buffer stream-ordered, so the device
// holds a few tensors' factors at a time besides the work buffers.
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

// The weight in fp32 or bf16 (merged in place, one rounding: kernels/lora_merge.h), as WeightMerge.
using LoraMergeHook = std::function<void(void* w, DType dtype, cudaStream_t stream)>;
// name -> hook, or an empty function for a tensor the set does not change. Null set: no hooks.
std::function<LoraMergeHook(const std::string& official_name)> lora_merge_hooks(std::shared_ptr<const LoraSet> set);

}  // namespace wan::cuda
