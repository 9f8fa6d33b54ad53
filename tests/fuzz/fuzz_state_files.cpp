// Fuzz target: the pipeline's own files (pipeline/files.h): prompt embeddings, latents and the
// paused-run state, all safetensors files with fixed tensor names. Each input is written to a file
// and read by all three readers. What they accept must keep the promises files.h makes: the
// documented ranks, no empty dimension, every value finite, at most 512 embedding rows, and for a
// state the step in 1..10000 and a sampler history as long as the latents.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "pipeline/files.h"
#include "pipeline/pipeline.h"

namespace {

using namespace wan;

void check_finite(const Tensor& t, const char* what) {
  fuzz::require(t.dtype() == DType::F32, what);
  for (int64_t i = 0; i < t.numel(); ++i) fuzz::require(std::isfinite(t.f32()[i]), what);
  for (int i = 0; i < t.ndim(); ++i) fuzz::require(t.dim(i) > 0, what);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = (fuzz::scratch_dir() / "input.safetensors").string();
  fuzz::write_file(path, data, size);
  fuzz::accepts([&] {
    const Tensor e = read_prompt_embeds(path);
    fuzz::require(e.ndim() == 2 && e.dim(0) <= 512, "embeddings are [L <= 512, D]");
    check_finite(e, "embeddings: f32, finite, no empty dim");
  });
  fuzz::accepts([&] {
    const Tensor l = read_latents(path);
    fuzz::require(l.ndim() == 4, "latents are [C, T, H, W]");
    check_finite(l, "latents: f32, finite, no empty dim");
  });
  fuzz::accepts([&] {
    const RunState st = read_run_state(path);
    fuzz::require(st.step >= 1 && st.step <= 10000, "state step in 1..10000");
    fuzz::require(st.latents.ndim() == 4 && st.prompt_embeds.ndim() == 2 && st.negative_embeds.ndim() == 2,
                  "state tensor ranks");
    check_finite(st.latents, "state latents");
    const size_t n = static_cast<size_t>(st.latents.numel());
    for (const auto* h : {&st.sampler.m_last, &st.sampler.m_prev, &st.sampler.last_sample})
      fuzz::require(h->empty() || h->size() == n, "sampler history as long as the latents");
    fuzz::require(st.timings.step_seconds.size() == static_cast<size_t>(st.step), "one time per step");
  });
  return 0;
}
