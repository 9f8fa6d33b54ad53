// Memory plans of the commands, checked before any heavy work: what a generate run, a decode and a
// forward hold at once on the host (weights, activations, video) and, for a GPU decode, on the device.
// A request that cannot fit, or that exceeds the DiT's RoPE, is one wan::Error (BadInput: exit 2) that
// says what was asked, what it needs and what fits.
// Invariants: plain arithmetic on configs and shapes (models' *_bytes functions) plus one query of the
// machine's memory; nothing is allocated.
#pragma once
#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "models/config.h"
#include "pipeline/pipeline.h"

namespace wan {

std::string human_bytes(int64_t bytes);  // "1.5 GB", "12.0 MB", "3.1 kB"
// This machine's RAM (0 when unknown), capped by a cgroup v2 memory.max and by WAN_HOST_MEMORY=BYTES.
int64_t physical_memory_bytes();

// The host side of a generate plan (its weights_peak_bytes / host_weights_bytes set): on the CPU the
// DiT's forward (a CFG batch of 2) or the decoder, whichever is larger; on a GPU the video it brings back.
void check_generate_host_memory(const GeneratePlan& p, bool on_gpu, bool decode);
// `wan decode` of latents [z, T, h, w] on `device` ("cpu" | "cuda[:i]"): the VAE's weights plus the
// CPU decoder's working set, or the video copies on the host and the GPU decoder's own need there.
void check_decode_memory(const VaeConfig& vae, const Shape& latents, const std::string& device);
// `wan encode-prompt` on the CPU: the encoder's f32 weights plus one 512-token forward.
void check_text_encoder_memory(const T5Config& c);
// `wan forward`: f32 weights of `cfg` plus one forward of `tokens` tokens (grid t x h x w, checked
// against the RoPE) with an output of `out_elems` floats.
void check_forward_memory(const DiTConfig& cfg, int64_t t, int64_t h, int64_t w, int64_t out_elems);

}  // namespace wan
