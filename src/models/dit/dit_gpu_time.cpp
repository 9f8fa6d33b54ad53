// The time side of the GPU DiT's forward (spec §2.4, §2.7, §2.9, §7.5.3): the checks of the timestep
// inputs, the fp32 time MLP and projection of each sample's one or two timesteps, and the modulation
// vectors (ModVec) that give every token row the embedding row of its timestep.
// Invariants: without DiTShape::first_frame_t the forward runs exactly the per-sample ops (one MLP
// pass over B rows, ModVecs without e_first). With it, t_first's pass runs the same GEMMs (same M, K, N,
// weights, scratch, and outputs at the arena's 256-byte alignment, so the same cuBLASLt plans) into its
// own buffers, so t_first == t reproduces the per-sample output bit for bit. A token takes t_first when
// its index in the whole sequence (slice offset + local row) is below Geometry::first_tokens.
#include "core/error.h"
#include "models/dit/dit_gpu_geometry.h"

namespace wan::cuda::dit_gpu_detail {

void check_timesteps(const Geometry& g, const DiTInputs& in) {
  if (g.first_frame)
    WAN_CHECK(in.t_first, "DiT GPU forward: DiTShape::first_frame_t needs DiTInputs::t_first (the timestep of "
              "latent frame 0's tokens)");
  else
    WAN_CHECK(!in.t_first, "DiT GPU forward: DiTInputs::t_first is given but DiTShape::first_frame_t is off (a "
              "first-frame timestep changes the forward's ops, so the shape says it)");
  if (!g.one_latent) return;
  for (int64_t b = 1; b < g.Bg; ++b) {
    WAN_CHECK(in.t[b] == in.t[0], "DiT GPU forward: one latent for every sample (DiTShape::one_latent) needs one "
              "timestep, but sample ", b, " has ", in.t[b], " and sample 0 ", in.t[0]);
    if (g.first_frame)
      WAN_CHECK(in.t_first[b] == in.t_first[0], "DiT GPU forward: one latent for every sample "
                "(DiTShape::one_latent) needs one first-frame timestep, but sample ", b, " has t_first ",
                in.t_first[b], " and sample 0 ", in.t_first[0]);
  }
}

void time_embedding(const TimeMlp& w, const Geometry& g, const float* t, float* sinus, float* temb, float* e_silu,
                    float* e, float* e0, const LinearF32& linear, cudaStream_t s) {
  const int64_t B = g.B, D = g.D;
  timestep_embedding(t, B, g.FQ, sinus, s);
  linear(sinus, w.w0, w.b0, temb, B, g.FQ, D, s);
  silu(temb, temb, B * D, s);
  linear(temb, w.w2, w.b2, e, B, D, D, s);
  silu(e, e_silu, B * D, s);
  linear(e_silu, w.wp, w.bp, e0, B, D, 6 * D, s);
}

namespace {
// Rows of sample b are [b·S, (b + 1)·S) and hold its tokens token0 .. token0 + S - 1; the first-frame
// ones read e_first's vector of the same sample (with Geometry::first_frame only).
ModVec split_by_frame(ModVec m, const float* e_first, const Geometry& g, const TimeRows& tr) {
  m.e_first = e_first;
  m.first_tokens = g.first_tokens;
  m.token0 = tr.token0;
  return m;
}
}  // namespace

ModVec block_mod(const float* modulation, int k, const Geometry& g, const TimeRows& tr) {
  const ModVec m{modulation + k * g.D, tr.e0 + k * g.D, 6 * g.D, g.S};
  return g.first_frame ? split_by_frame(m, tr.e0_first + k * g.D, g, tr) : m;
}

ModVec head_mod(const float* modulation, int k, const Geometry& g, const TimeRows& tr) {
  const ModVec m{modulation + k * g.D, tr.e, g.D, g.S};
  return g.first_frame ? split_by_frame(m, tr.e_first, g, tr) : m;
}

}  // namespace wan::cuda::dit_gpu_detail
