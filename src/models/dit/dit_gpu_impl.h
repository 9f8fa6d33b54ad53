// Internal to the GPU DiT (dit_gpu.cpp, dit_gpu_residency.cpp): DiTGpu's state (plan, weights, arena,
// streams, graphs, op profiler) and the forward's pieces that read it. Not part of the model's interface.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/attention_cudnn.h"
#include "kernels/attention_fp8.h"
#include "kernels/attention_own.h"
#include "kernels/check.h"
#include "kernels/dit_kernels.h"
#include "kernels/fp8_quant.h"
#include "kernels/gemm.h"
#include "models/dit/block_spill.h"
#include "models/dit/dit_gpu.h"
#include "models/dit/dit_gpu_geometry.h"
#include "models/dit/seq_attention_gpu.h"
#include "models/weights_gpu.h"

namespace wan::cuda {

using dit_gpu_detail::DeviceTable;
using namespace dit_gpu_detail;  // Geometry, geometry(), the arena constants (dit_gpu_geometry.h)

// The weights' residency when not Resident (dit_gpu_residency.cpp): pinned host copies of every expert,
// the device slots and the copy stream of StreamBlocks, which expert SwapExperts has on the device.
struct ResidencyState {
  BlockLayout layout;
  struct HostImage {
    char* data;    // a registered anonymous mapping (alloc_host)
    size_t bytes;
  };
  std::vector<HostImage> host;  // one whole allocation image per expert (StreamBlocks: its blocks' bytes)
  DeviceTable nonblock;     // StreamBlocks: the non-block tensors, compacted (each expert's device allocation)
  char* slots = nullptr;    // StreamBlocks: `count` slots of slot_bytes
  size_t slot_bytes = 0;
  int count = 0;
  cudaStream_t copy = nullptr;
  cudaEvent_t fork = nullptr;
  std::vector<cudaEvent_t> loaded, freed;  // per slot
  int on_device = -1;       // SwapExperts: whose weights the device allocation holds
  // StreamBlocks from disk: the blocks in a spill file (host stays empty), and per slot the number of the
  // request that fills it last (BlockSpill::wait before a stream waits on its `loaded` event).
  std::unique_ptr<BlockSpill> spill;
  std::vector<uint64_t> slot_request;
  ResidencyState() = default;
  ResidencyState(const ResidencyState&) = delete;
  ResidencyState& operator=(const ResidencyState&) = delete;
  ~ResidencyState();
};

struct DiTGpu::Impl {
  DiTConfig cfg;
  DiTShape max_shape;
  Geometry max_geo{};
  Options opt;
  MemoryPlan plan;
  DeviceTable table;
  std::vector<void*> weights;  // Resident / StreamBlocks: one allocation per expert; SwapExperts: one
  std::unique_ptr<ResidencyState> res;  // null when Resident
  std::vector<ExpertPtrs> ptrs;
  char* arena = nullptr;
  size_t attn_ws_bytes = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t ev_in = nullptr, ev_out = nullptr;
  std::unique_ptr<CudnnAttention> attn;  // null when the own kernel runs the attention
  std::unique_ptr<GemmRunner> gemm;
  // Parallel forward (null / 0 / 1 on one GPU): the groups, this rank's place, the split self-attention.
  dist::Layout par;
  int cfg_rank = 0, seq_rank = 0;
  std::unique_ptr<SeqParallelAttention> spa;
  float* head_seq = nullptr;
  // expert, B, T, H, W, share_first, first_frame
  using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, bool, bool>;
  static Key key_of(int expert, const DiTShape& shape, const Geometry& g) {
    return Key{expert, shape.batch, shape.frames, shape.height, shape.width, g.share_first(), g.first_frame};
  }
  std::map<Key, cudaGraphExec_t> graphs;
  std::set<Key> warmed;
  // In-step op profile (profile_forward): the event pool lives as long as the object; `prof` points to
  // it only during a profiled forward, so every hook below is one null test when profiling is off.
  enum class OpCat : uint8_t { Gemm, SelfAttention, CrossAttention };
  struct OpProfiler {
    struct Span {
      OpCat cat;
      size_t begin, end;  // indices into events
    };
    std::vector<cudaEvent_t> events;  // created before the profiled forward, never inside it
    size_t used = 0;
    std::vector<Span> spans;
    ~OpProfiler() {
      for (cudaEvent_t e : events) cudaEventDestroy(e);
    }
    void reserve(size_t n) {
      events.reserve(n);
      while (events.size() < n) {
        cudaEvent_t e = nullptr;
        CUDA_CHECK(cudaEventCreate(&e));
        events.push_back(e);
      }
    }
    size_t mark(cudaStream_t s) {
      WAN_ASSERT(used < events.size(), "op profiler: the pool of ", events.size(), " events is exhausted");
      CUDA_CHECK(cudaEventRecord(events[used], s));
      return used++;
    }
  };
  std::unique_ptr<OpProfiler> profiler;
  OpProfiler* prof = nullptr;

  // arena buffers
  float *x_in, *t, *ctx_f32, *sinus, *temb, *e, *e_silu, *e0, *rope, *resid, *head_out, *out;
  float *t_first, *e_first, *e0_first;  // DiTShape::first_frame_t
  float* x_scale = nullptr;             // DiTGemm::Fp8: the quantised GEMM input's row scales
  bf16 *ctx_in, *ctx_hidden, *ctx, *ckv, *ck, *h, *att, *big;
  bf16 *kv = nullptr, *patch_rows = nullptr;  // chunked rows (MemoryPlan::chunk_rows): [rows, 2D], [rows, K]
  void *gemm_ws, *attn_ws;

  ~Impl() {
    // No throws from here: let queued work finish, then release in reverse order of creation,
    // ignoring errors.
    if (stream) cudaStreamSynchronize(stream);
    profiler.reset();
    spa.reset();
    res.reset();
    for (auto& [k, g] : graphs) cudaGraphExecDestroy(g);
    gemm.reset();
    attn.reset();
    for (void* w : weights) cudaFree(w);
    if (arena) cudaFree(arena);
    if (ev_in) cudaEventDestroy(ev_in);
    if (ev_out) cudaEventDestroy(ev_out);
    if (stream) cudaStreamDestroy(stream);
  }

  template <typename T>
  T* buf(const std::string& name) const {
    return reinterpret_cast<T*>(arena + plan.get(name).offset);
  }
  void bind_buffers() {
    x_in = buf<float>("x_in"), t = buf<float>("t"), ctx_f32 = buf<float>("ctx_f32");
    ctx_in = buf<bf16>("ctx_in"), ctx_hidden = buf<bf16>("ctx_hidden"), ctx = buf<bf16>("ctx");
    ckv = buf<bf16>("ckv"), ck = buf<bf16>("ck");
    sinus = buf<float>("sinus"), temb = buf<float>("temb"), e = buf<float>("e"), e_silu = buf<float>("e_silu");
    e0 = buf<float>("e0"), rope = buf<float>("rope"), resid = buf<float>("resid");
    t_first = buf<float>("t_first"), e_first = buf<float>("e_first"), e0_first = buf<float>("e0_first");
    h = buf<bf16>("h"), att = buf<bf16>("att"), big = buf<bf16>("big");
    head_out = buf<float>("head_out"), out = buf<float>("out");
    gemm_ws = buf<void>("cublaslt_workspace"), attn_ws = buf<void>("cudnn_workspace");
    if (plan.gemm == Gemm::Fp8) x_scale = buf<float>("fp8.x_scale");
    if (plan.chunk_rows > 0) kv = buf<bf16>("kv"), patch_rows = buf<bf16>("patch_rows");
  }
  // The parallel part of create(): checks the groups against each other, creates the split
  // self-attention and binds its arena buffers (after bind_buffers).
  void setup_parallel();
  // cat: SelfAttention (or a sequence-parallel piece of it) or CrossAttention. kv: Fp8KV::Reuse when the
  // previous attention call had the same keys and values (the FP8 kernel then quantises Q alone).
  void run_attention(OpCat cat, const AttentionShape& sh, const AttentionArgs& a, cudaStream_t s,
                     Fp8KV kv = Fp8KV::Quantize) {
    if (attn) attn->run(sh, a, attn_ws, attn_ws_bytes, s);
    // FP8 for the self-attention; the text cross-attention (512 keys) stays on the bf16 own kernel, where
    // the FP8 quantisation passes cost more than they save (B 2, H 40, 75600 x 512: 5.2 vs 2.7 ms, H100).
    else if (opt.attention == Attention::OwnFp8 && cat == OpCat::SelfAttention)
      OwnAttentionFp8::run(sh, a, attn_ws, attn_ws_bytes, s, kv);
    else OwnAttention::run(sh, a, s);
  }
  // The forward's GEMMs and (single-GPU / CFG-parallel) attentions, bracketed by events when profiling.
  template <typename X, typename Wt, typename Bias, typename Y>
  void linear_op(const X* x, const Wt* w, const Bias* bias, Y* y, int64_t M, int64_t K, int64_t N, Act act,
                 cudaStream_t s) {
    if (!prof) return gemm->linear(x, w, bias, y, M, K, N, act, s);
    const size_t b = prof->mark(s);
    gemm->linear(x, w, bias, y, M, K, N, act, s);
    prof->spans.push_back({OpCat::Gemm, b, prof->mark(s)});
  }
  // A block GEMM y = act(x·wᵀ + bias): bf16, or with w_scale (DiTGemm::Fp8: w is e4m3 rows) x's rows
  // quantised into xq (an arena view free at this point, see block()) and x_scale first; one profiled
  // GEMM interval either way.
  void block_linear(const bf16* x, const bf16* w, const float* w_scale, const bf16* bias, bf16* y, int64_t M,
                    int64_t K, int64_t N, Act act, void* xq, cudaStream_t s) {
    if (!w_scale) return linear_op(x, w, bias, y, M, K, N, act, s);
    fp8_linear({static_cast<uint8_t*>(xq), x_scale}, x, w, w_scale, bias, y, M, K, N, act, s);
  }
  // The FP8 GEMM on the e4m3 rows in `in`, quantised from `from` first unless null (a LayerNorm wrote
  // them, norm_out()); the quantisation is inside the profiled interval.
  void fp8_linear(const Fp8Rows& in, const bf16* from, const bf16* w, const float* w_scale, const bf16* bias, bf16* y,
                  int64_t M, int64_t K, int64_t N, Act act, cudaStream_t s) {
    const size_t b = prof ? prof->mark(s) : 0;
    if (from) quantize_rows_fp8(from, M, K, in.q, in.scale, s);
    gemm->linear_fp8(in.q, in.scale, reinterpret_cast<const uint8_t*>(w), w_scale, bias, y, M, K, N, act, s);
    if (prof) prof->spans.push_back({OpCat::Gemm, b, prof->mark(s)});
  }
  // DiTGemm::Fp8: the LayerNorms that feed a GEMM (norm1, norm3, norm2) quantise their rows into h's
  // bytes and x_scale, which only that GEMM reads; otherwise they write bf16 rows to h.
  Fp8Rows norm_out() const { return {reinterpret_cast<uint8_t*>(h), x_scale}; }
  bool fp8() const { return x_scale != nullptr; }
  // A LayerNorm into the next GEMM's input: `ln` is called with norm_out() or h.
  template <typename F>
  void norm_into_h(F&& ln) {
    if (fp8()) ln(norm_out());
    else ln(h);
  }
  // The block GEMM reading what norm_into_h wrote.
  void linear_from_h(const bf16* w, const float* w_scale, const bf16* bias, bf16* y, int64_t M, int64_t K, int64_t N,
                     Act act, cudaStream_t s) {
    if (fp8()) fp8_linear(norm_out(), nullptr, w, w_scale, bias, y, M, K, N, act, s);
    else linear_op(h, w, bias, y, M, K, N, act, s);
  }
  void attention_op(OpCat cat, const AttentionShape& sh, const AttentionArgs& a, cudaStream_t s,
                    Fp8KV kv = Fp8KV::Quantize) {
    if (!prof) return run_attention(cat, sh, a, s, kv);
    const size_t b = prof->mark(s);
    run_attention(cat, sh, a, s, kv);
    prof->spans.push_back({cat, b, prof->mark(s)});
  }
  // Events one profiled forward of `layers` blocks records at most: 2 around the forward, 2 per interval
  // (10 GEMMs outside the blocks with a first-frame timestep). Chunked rows (`units` chunks of all
  // samples): per block 1 + 9 per chunk, and the patch embedding and head once per chunk.
  static size_t profile_events(int layers, int64_t units = 0) {
    if (units > 0) return 2 + 2 * static_cast<size_t>(10 + 2 * units + layers * (1 + 9 * units));
    return 2 + 2 * static_cast<size_t>(10 + 7 * layers + 2 * layers);
  }
  // forward() after the checks; eager: run the body even when a graph exists (profile_forward).
  void forward(int expert, const DiTShape& shape, const DiTInputs& in, float* out, cudaStream_t stream, bool eager);
  void head_and_output(const ExpertPtrs& w, const Geometry& g, cudaStream_t s);

  // The activation arena and what lives in it (bound buffers, parallel setup, GEMM runner, RoPE table):
  // in create(), or later with Options::defer_arena. Checks the free memory first.
  void allocate_arena();
  // The RoPE table: the one arena buffer written once, not per forward (again after a fill used the arena).
  void write_rope();
  // ---- the weights' residency (dit_gpu_residency.cpp) ----
  // create()'s weight part: the allocations of plan.residency, filled from `experts`; ptrs resolved.
  void place_weights(const std::vector<DiTWeightSource>& experts);
  bool streaming() const { return res && res->count > 0; }
  // StreamBlocks (no-ops otherwise): the copy stream forks from s and copies the first blocks; s waits
  // until block `block` is in its slot; block `block` is done, so its slot takes block + slots.
  void stream_begin(int expert, cudaStream_t s);
  void stream_wait(int block, cudaStream_t s) {
    if (!streaming() || block >= cfg.num_layers) return;
    const size_t slot = static_cast<size_t>(block % res->count);
    if (res->spill) res->spill->wait(res->slot_request[slot]);  // its read is done and its copy queued
    CUDA_CHECK(cudaStreamWaitEvent(s, res->loaded[slot], 0));
  }
  // Forwards may run as CUDA graphs: Options::use_graphs, and no block streams from disk (its reads are
  // waited for on the host).
  bool graphs_allowed() const { return opt.use_graphs && !(res && res->spill); }
  void stream_next(int expert, int block, cudaStream_t s);
  // SwapExperts: copies `expert`'s weights onto the device unless they are there (before a forward).
  void swap_in(int expert, cudaStream_t s);
  Tensor download(int expert, const std::string& name) const;

  // Captures and instantiates the graph of (key) without running it (warm_up).
  void capture(const Key& key, const ExpertPtrs& w, const Geometry& g, cudaStream_t s);
  void stage_inputs(const Geometry& g, const DiTInputs& in, cudaStream_t s);
  void run_body(const ExpertPtrs& w, const Geometry& g, cudaStream_t s);
  // ---- chunked rows (MemoryPlan::chunk_rows > 0; dit_gpu_chunked.cpp) ----
  // The chunks of a forward of g: every sample's rows in pieces of chunk_rows (0 when not chunked).
  int64_t chunk_units(const Geometry& g) const {
    if (plan.chunk_rows <= 0) return 0;
    const int64_t C = std::min(plan.chunk_rows, g.S);
    return g.B * ((g.S + C - 1) / C);
  }
  // run_body's chunked form: the patch embedding, the blocks and the head one chunk of rows at a time.
  void run_body_chunked(const ExpertPtrs& w, const Geometry& g, const RopeArgs& rope_args, cudaStream_t s);
  // One block: every chunk's keys and values first, then each chunk's self-attention, cross-attention
  // and FFN, its residual rows updated in place (the caller waits for its streamed weights).
  void block_chunked(const BlockPtrs& w, const Geometry& g, const RopeArgs& rope_args, cudaStream_t s);
  // One block; on entry h holds its norm1 output, `next` is the following block (null for the last),
  // whose norm1 this block's last residual add computes on the way. `shared`: every sample's input is
  // sample 0's (the first block with Geometry::share_first()): h holds sample 0's rows only, and the
  // self-attention part runs for those and is copied to the other samples.
  // `index`: the block's place (the streamed weights' waits).
  void block(const BlockPtrs& w, const BlockPtrs* next, int index, const Geometry& g, const RopeArgs& rope_args,
             bool shared, cudaStream_t s);
  // This forward's time embedding rows (dit_gpu_time.cpp picks a token's row from them).
  TimeRows time_rows(const Geometry& g) const { return {e, e0, e_first, e0_first, seq_rank * g.S}; }
  // Modulation vector k of a block for this step's rows: m = modulation + e0 (fp32), folded into the
  // kernel that uses it; chunk k of sample b is mod[k] + e0[b, k] (e0 of t_first for frame 0's tokens).
  ModVec block_mod(const BlockPtrs& w, int k, const Geometry& g) const {
    return dit_gpu_detail::block_mod(w.mod, k, g, time_rows(g));
  }
};

}  // namespace wan::cuda
