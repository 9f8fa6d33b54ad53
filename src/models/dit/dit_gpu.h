// The Wan DiT (official WanModel, spec §2) forward on one GPU with the reference's bf16 numerics
// (spec §2.10): bf16 weights and GEMM inputs with fp32 accumulation (cuBLASLt), the residual stream,
// norms, modulation, RoPE, time embedding and output head in fp32, own / cuDNN flash attention.
// Classifier-free guidance runs as one batch (cond, uncond), so each weight is read once per step.
//
// Invariants (in full below the namespace line): memory is planned before anything is allocated (one
// weight allocation per expert, one activation arena) and create() refuses in one line naming what
// would fit; no padding rows on one GPU; a parallel forward splits CFG and the sequence (dist::Layout)
// and communicates only in the self-attention; forward() is deterministic, graph replay or not; the
// first forward of a shape builds the plans, the second captures a CUDA graph; not thread-safe.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/layout.h"    // RawSpan (plain data)
#include "models/config.h"
#include "core/tensor.h"
#include "kernels/seq_comm.h"
#include "models/weights_gpu.h"  // WeightGetter, WeightSpanFn
#include "runtime/dist/parallel_layout.h"

namespace wan::cuda {

// The Wan DiT (official WanModel, spec §2) forward on one GPU with the reference's bf16 numerics
// (spec §2.10): bf16 weights and GEMM inputs with fp32 accumulation (cuBLASLt), the residual stream,
// norms, modulation, RoPE, time embedding and output head in fp32, cuDNN fused flash attention.
// Classifier-free guidance runs as one batch (cond, uncond), so each weight is read once per step.
//
// Memory is planned, not discovered: one device allocation per expert holds all its weights (bf16 for
// GEMM weights and q/k norm weights; fp32 for the modulation tables, norm3, the time MLP/projection and
// the head, which the reference computes in fp32), and one activation arena, sized by DiTGpu::plan()
// from (config, max latent shape, batch) before anything is allocated, holds every activation and the
// cuBLASLt/cuDNN workspaces. create() throws one wan::Error naming what would fit when the plan does not.
//
// Invariants:
// - Sequence length = f·h·w (the single-GPU official seq_len): no padding rows, so self-attention
//   attends to every key (the reference's k_lens = seq_lens is the full length); cross-attention attends
//   to all text_len slots, zero-padded prompts included (spec §2.5).
// - Parallel forward (Options::parallel, spec §8): CFG-parallel runs one sample per half of the
//   ranks; with a split sequence the tokens are padded to a multiple of Ulysses x Ring, each rank holds
//   one contiguous slice (RoPE at the slice's global positions), padded keys are masked with k_lens,
//   and only the self-attention communicates (models/dit/seq_attention_gpu.h); the modulation, time and text
//   embeddings are computed on every rank, cross-attention uses the local queries against the whole
//   text. The head rows are all-gathered (sequence, then CFG) so every rank returns the whole batch.
//   NCCL calls are captured into the forward's CUDA graph like every other op (all ranks capture the
//   same sequence, after the eager first forward has set up every NCCL connection).
// - Timesteps: one per sample (T2V/I2V A14B, TI2V text mode), or with DiTShape::first_frame_t two
//   (TI2V image mode: latent frame 0's tokens take their own, spec §7.5.3). The time MLP and projection
//   run once per distinct timestep of a sample, never per token; each modulation, gate and the head pick
//   a token's row by its index in the whole sequence (sequence parallel: slice offset + local row).
// - CFG with one latent (DiTShape::one_latent, what the samplers run): cond and uncond are the same
//   up to the first block's cross-attention, so that block's self-attention part runs once (halves
//   its cost; about 1/40 of the self-attention work of a step).
// - forward() is deterministic: the same inputs give bit-identical outputs, graph replay or not.
// - The first forward of an (expert, shape) runs eagerly (it builds every cuBLASLt/cuDNN plan); the
//   second captures a CUDA graph of the whole forward, later ones replay it. warm_up() instead builds
//   the plans and captures the graph without running a forward, so the first forward replays. Inputs are copied into
//   fixed arena buffers before the graph, the output copied out after it.
// - All work runs on an internal stream ordered after / before the caller's stream with events.
// - In-step op profile (`wan bench`): profile_forward() runs one forward of the production code
//   path eagerly (never a graph: events inside a graph cannot be read per op) with a CUDA event recorded
//   on the stream before and after every GEMM (GemmRunner::linear) and every self- and cross-attention,
//   from an event pool created before the forward (sized from the op count). Off (every other forward)
//   the hooks cost one null-pointer test each. It refuses a stream that is being captured and a split
//   sequence (the sequence-parallel self-attention is not bracketed; CFG-parallel is fine).
// - Not thread-safe; one object per device. Files: dit_gpu.cpp (creation, forward, graphs, profile),
//   dit_gpu_plan.cpp (geometry, memory plan), dit_gpu_time.cpp (time embedding, timestep rows per token),
//   models/weights_gpu.cpp (placement of the weight table, upload, random draw), kernels/affine.cu (init kernels).

// Latent geometry of one forward: x is [batch, in_dim, frames, height, width] (latent units; height and
// width multiples of the patch).
struct DiTShape {
  int64_t batch = 2;  // samples: 2 for CFG (cond, uncond)
  int64_t frames = 1, height = 2, width = 2;
  // Every sample has the same latent and timestep (CFG: cond and uncond of one latent; the samplers'
  // batch-2 step). forward() then reads only the first latent of DiTInputs::x (and checks the
  // timesteps are equal), and, since the samples are identical up to the first block's cross-attention
  // (only the text differs), runs that block's norm1, q|k|v, self-attention and o projection once for
  // one sample and copies the result to the others (single GPU / CFG-parallel ranks with more than one
  // sample; not with a split sequence). That part's numbers are those of a one-sample computation:
  // within the GEMMs' fp32 accumulation order (cuBLASLt may pick another kernel for the smaller M) of
  // the batched one; the own attention kernel gives bit-identical rows.
  bool one_latent = false;
  // TI2V image mode (spec §7.5.3): the tokens of latent frame 0 (the first (H/2)·(W/2) of each sample at
  // the patch (1, 2, 2); generally those of the first patch frame) take the timestep DiTInputs::t_first,
  // every other token (sequence padding included) t. Equals the reference's per-token t [B, seq_len]
  // built that way; the time embedding runs for 2·B timesteps instead of B (3 more small fp32 GEMMs
  // through the same plans, so t_first == t gives the per-sample forward's output bit for bit).
  bool first_frame_t = false;
  bool operator==(const DiTShape&) const = default;
};

// Where an expert's weights come from: a name -> tensor callback (official names, any float dtype,
// converted on the host), or drawn on the GPU from the engine RNG at the real sizes (no files).
using DiTWeightGetter = WeightGetter;
// Where a tensor's stored bytes lie in its file (WeightStore::raw_span); nullopt: read it with `get`.
using DiTWeightSpan = WeightSpanFn;
class DeviceLoader;  // runtime/load_gpu.h
struct DiTWeightSource {
  DiTWeightGetter get;  // used when !random
  bool random = false;
  uint64_t seed = 0;
  // Streaming (load_gpu.h): with `span`, the weights go file -> pinned staging -> device and
  // are converted on the GPU (tensors without a span through `get`). With `loader` too, create() only
  // adds them to that loader (not started; completion group `group`): the caller starts it and waits
  // for it before the first forward.
  DiTWeightSpan span;
  // Optional, either source: the LoRA merge hooks by official name (weights_gpu.h WeightMergeFn).
  WeightMergeFn merge;
  DeviceLoader* loader = nullptr;
  int group = 0;
  // Issue 5 (sharded load, pipeline/generate_parallel.h): create() allocates the expert but leaves it
  // unfilled; the caller writes it through weight_allocation() before the first forward.
  bool external = false;
  static DiTWeightSource from(DiTWeightGetter g) {
    DiTWeightSource s;
    s.get = std::move(g);
    return s;
  }
  static DiTWeightSource random_weights(uint64_t seed) {
    DiTWeightSource s;
    s.random = true;
    s.seed = seed;
    return s;
  }
};

// Random weights: tensor `name` element i = round(philox_normal(random_weight_key(seed, name), i) ·
// scale + offset) to its storage dtype, scale and offset from the weight table's init rule (normal_draw,
// models/weight_spec.h).

// A parallel forward (dist::Layout, spec §8): cfg = 2 splits the batch-2 CFG forward into one
// sample per half of the ranks; ulysses x ring ranks share each sample's token sequence (Ulysses:
// all-to-all over heads, ulysses must divide the heads; Ring: key/value blocks passed around the ring,
// partial results merged with the log-sum-exp). The sequence is padded to a multiple of ulysses·ring
// tokens and each rank holds one contiguous slice of it. All 1: the single-GPU forward.
//
// The token split of one sample's sequence of `tokens` real tokens over `seq` ranks: padded length,
// tokens per rank.
struct SeqSplit {
  int64_t padded = 0, per_rank = 0;
};
SeqSplit seq_split(int64_t tokens, int seq_ranks);

// The block GEMMs' arithmetic (DiTGpu::Options::gemm). Bf16: the reference's bf16 GEMMs (exact). Fp8 (opt-in,
// sm_90): the 7 GEMMs of every block (q|k|v, o, cross q, cross k|v, cross o, ffn.0, ffn.2) store their
// weights as e4m3 rows [N, K] with one fp32 scale per output row (core/fp8_rows.h), quantised once as
// they load (after any LoRA merge), and quantise their bf16 input rows per token before each GEMM
// (GemmRunner::linear_fp8, with its default fast accumulation: Fp8Accumulate::Fast). Biases, norms,
// modulation, embeddings and the head stay as in Bf16.
enum class DiTGemm : uint8_t { Bf16, Fp8 };

// Where the experts' weights live while the DiT runs (issue 27's low-memory mode; Options::residency,
// MemoryPlan::residency). Every mode runs the same kernels on the same weight bytes, so the outputs are
// bit-identical to Resident's; the modes trade device memory for PCIe copies:
//   Resident      every expert's weights on the device (the default, fastest).
//   SwapExperts   one expert's weights on the device; every expert waits in pinned host memory and is
//                 copied in (one transfer of the whole allocation) when a forward of it follows another's.
//   StreamBlocks  each expert's weights outside the blocks on the device; the blocks stream from pinned
//                 host memory through a ring of `slots` device buffers on a copy stream (inside the CUDA
//                 graph): block i + slots is copied once block i is done, while the blocks between run.
//                 With `disk`, the blocks wait in a spill file instead of pinned memory (block_spill.h:
//                 read back through the page cache per forward, two pinned staging buffers; no CUDA
//                 graphs), for hosts that cannot pin every expert.
// `chunks` > 1 (any mode, one GPU) also processes each sample's rows in that many chunks: the keys and
// values of every row are kept, everything else of a block (its norms, q, the attentions, the
// projections, the FFN) runs one chunk at a time in buffers of chunk size, so the activations take about
// 8·D bytes per row instead of 14·D. Chunking changes the GEMMs' row counts, and with them cuBLASLt's
// choice of kernels, so it is not bit-identical to the whole-row forward (dit_gpu_chunked.cpp).
struct WeightResidency {
  enum class Mode : uint8_t { Resident, SwapExperts, StreamBlocks };
  Mode mode = Mode::Resident;
  int slots = 0;  // StreamBlocks: >= 2 (block i's last residual add reads block i + 1's modulation)
  bool disk = false;  // StreamBlocks: from a spill file
  int chunks = 0;     // > 1: each sample's rows in this many chunks (see above); 0 or 1: whole rows
  static WeightResidency resident() { return {}; }
  static WeightResidency swap() { return {Mode::SwapExperts, 0}; }
  static WeightResidency stream(int slots) { return {Mode::StreamBlocks, slots}; }
  static WeightResidency stream_disk(int slots) { return {Mode::StreamBlocks, slots, true}; }
  WeightResidency chunked(int n) const {
    WeightResidency r = *this;
    r.chunks = n;
    return r;
  }
  bool operator==(const WeightResidency&) const = default;
  // "resident" | "expert swap" | "block streaming (3 slots[, from disk])", then ", rows in N chunks"
  std::string str() const;
};

// The arena layout of one (config, shape): every buffer's byte offset and size. Views alias a region
// whose live ranges never overlap (e.g. the FFN hidden reuses the QKV region).
struct MemoryPlan {
  struct Buffer {
    std::string name;
    size_t offset = 0, bytes = 0;
    bool view = false;  // aliases part of an earlier buffer
  };
  DiTShape shape;
  int experts = 1;
  DiTGemm gemm = DiTGemm::Bf16;
  dist::Layout parallel;  // the plan of one rank of this layout (all 1: one GPU)
  std::vector<Buffer> buffers;
  size_t arena_bytes = 0;   // activations + workspaces
  size_t weight_bytes = 0;  // one expert
  size_t reserve_bytes = 0; // headroom kept free for handles, kernels and graphs
  WeightResidency residency;
  int64_t chunk_rows = 0;     // WeightResidency::chunks > 1: rows per chunk (128-aligned, 16 at small sizes), else 0
  size_t block_bytes = 0;     // the largest block's weights (a StreamBlocks slot)
  size_t nonblock_bytes = 0;  // one expert's weights outside the blocks (StreamBlocks keeps them on the device)
  int layers = 0;             // blocks per expert (no more slots than blocks)
  // The experts' weights on the device: all of them (Resident), one expert (SwapExperts), or every
  // expert's non-block weights plus the slots (StreamBlocks).
  size_t device_weight_bytes() const;
  // Pinned host memory the residency holds: one whole expert allocation per expert unless Resident;
  // from disk, two staging buffers of one block.
  size_t host_weight_bytes() const;
  // Bytes of the spill file (StreamBlocks from disk: every expert's blocks), else 0.
  size_t disk_bytes() const;
  size_t total_bytes() const { return arena_bytes + device_weight_bytes() + reserve_bytes; }
  const Buffer& get(const std::string& name) const;  // throws wan::Error for an unknown name
  std::string str() const;                           // the table in MiB
};

// Inputs of one forward. Host or device pointers where stated (copied with cudaMemcpyDefault).
struct DiTInputs {
  const float* x = nullptr;           // [B, in_dim, T, H, W] f32 latents (I2V: y already concatenated);
                                      // with DiTShape::one_latent only the first is read
  const float* t = nullptr;           // [B] host: one timestep per sample (with DiTShape::first_frame_t
                                      // that of every token but latent frame 0's)
  const float* t_first = nullptr;     // [B] host: the timestep of latent frame 0's tokens (TI2V image
                                      // mode: 0); given iff DiTShape::first_frame_t. With one_latent both
                                      // t and t_first must be equal across samples
  const void* context = nullptr;      // [B, ctx_rows, text_dim] text encoder output
  DType context_dtype = DType::F32;   // F32 or BF16
  int64_t ctx_rows = 0;               // rows per sample in `context` (1 <= ctx_rows <= text_len)
  const int64_t* ctx_lens = nullptr;  // [B] host: real rows per sample; rows beyond are zero-padded
};

// What profile_forward() measured: one eager forward, CUDA events on the forward's stream. Intervals
// are disjoint (one stream), so other_ms() >= 0 up to the events' resolution (about 0.5 us each).
struct OpProfile {
  int layers = 0;
  int gemms = 0;             // GEMM intervals: 7 per block (q|k|v, o, cross q, cross k|v, cross o, FFN up,
                             // FFN down; with DiTGemm::Fp8 the o, cross k|v, cross o and FFN-down ones
                             // include their input's quantisation, the LayerNorms quantise the others')
                             // + 7 outside (patch embedding, time MLP 2 + projection, text MLP 2, head)
                             // + 3 with DiTShape::first_frame_t (the time MLP and projection of t_first)
  int self_attentions = 0;   // 1 per block
  int cross_attentions = 0;  // 1 per block
  double total_ms = 0;       // first event to last: input staging, the whole body, the output copy (what a
                             // forward() call puts on the stream, as the bench's step time counts it)
  double gemm_ms = 0, self_attention_ms = 0, cross_attention_ms = 0;  // sums of the intervals
  // Every kernel that is neither a GEMM nor an attention (norms, RoPE, residual adds, embeddings' glue,
  // copies) plus the gaps between kernels.
  double other_ms() const { return total_ms - gemm_ms - self_attention_ms - cross_attention_ms; }
};

class DiTGpu {
 public:
  // Attention kernel: Auto = the engine's own Hopper kernel (attention_own.h) on sm_90, cuDNN elsewhere;
  // OwnFp8 = the own FP8 kernel (attention_fp8.h, opt-in, lossy: its workspace is in the arena's plan).
  enum class Attention { Auto, Cudnn, Own, OwnFp8 };
  using Gemm = DiTGemm;
  struct Options {
    int device = 0;
    bool use_graphs = true;
    bool verbose = false;  // print the memory plan (MiB) to stderr at create
    Attention attention = Attention::Auto;
    // Fp8: create() refuses a device without cuda::fp8_supported.
    Gemm gemm = Gemm::Bf16;
    // Allocate the activation arena in warm_up() (or the first forward) instead of create(), so that a
    // text encoder loaded next to the weights can be freed first; create() then checks only
    // the weights against the free memory. Loaded weights only (random ones are drawn into the arena).
    bool defer_arena = false;
    // The plan of exactly this (config, max_shape, experts, parallel layout) from plan() without
    // cuDNN's workspace, already checked against the device by the caller (the pipeline's run-level
    // memory plan): create() then skips its own fit check and only allocates, extending that plan by
    // the attention workspace it finds. Null: create() plans and checks itself.
    std::shared_ptr<const MemoryPlan> planned;
    // Where the weights live (issue 27). Not Resident: the weights are loaded or drawn through the device
    // in windows (the arena, or the slots when larger) into pinned host memory; needs loaded or random
    // weights without a caller's loader, an external fill or defer_arena, and one GPU.
    WeightResidency residency;
    // Parallel forward: the groups this rank belongs to, owned by the caller (src/runtime/dist
    // implements them with NCCL) and alive as long as the DiTGpu. Null = degree 1. Ranks are laid out
    // as rank = (cfg rank·ring + ring rank)·ulysses + Ulysses rank: `seq` is the group of the
    // ulysses·ring ranks that share one sample (its rank = ring rank·ulysses + Ulysses rank, the index of
    // this rank's token slice), `ulysses` the consecutive ranks inside it, `ring` the ranks of equal
    // Ulysses rank, `cfg` the two ranks of equal sequence rank. With cfg, forward() takes the usual
    // batch-2 inputs and output but runs only sample cfg->rank(); every rank ends with the whole output.
    struct Parallel {
      SeqComm* cfg = nullptr;
      SeqComm* ulysses = nullptr;
      SeqComm* ring = nullptr;
      SeqComm* seq = nullptr;  // required when ulysses·ring > 1
      dist::Layout degrees() const;
    };
    Parallel parallel;
  };
  // "auto" | "cudnn" | "own" | "own-fp8"; throws wan::Error otherwise.
  static Attention parse_attention(const std::string& s);
  // The kernel `a` resolves to on the current device (never Auto); Own / OwnFp8 on a non-sm_90 device throw.
  static Attention resolve_attention(Attention a);
  Attention attention() const;  // what this object runs
  // "bf16" | "fp8"; throws wan::Error otherwise.
  static Gemm parse_gemm(const std::string& s);
  Gemm gemm() const;

  // Plans the arena for max_shape, checks that experts.size() weight sets plus the arena fit the free
  // device memory (throws before allocating anything when they do not, naming the frames that fit;
  // with Options::planned the caller has done both), then allocates, uploads or draws the weights.
  // Every later forward must fit max_shape (batch <= max batch, tokens <= max tokens).
  static DiTGpu create(const DiTConfig& cfg, const std::vector<DiTWeightSource>& experts, const DiTShape& max_shape,
                       const Options& opt);
  static DiTGpu create(const DiTConfig& cfg, const std::vector<DiTWeightSource>& experts, const DiTShape& max_shape) {
    return create(cfg, experts, max_shape, Options{});
  }
  // The plan create() would use; attn_workspace = cuDNN's workspace for the shape's attentions (create
  // asks cuDNN; 0 is the usual value on Hopper). Pure host arithmetic.
  // `par`: the per-rank plan of a parallel forward (activations of this rank's sample(s) and token slice
  // plus the communication buffers); shape stays the global one.
  // `gemm`: Fp8 counts the e4m3 block weights (1 byte per element + 4 per output row) and the
  // quantised GEMM inputs (views of the arena where their live ranges allow, see dit_gpu_plan.cpp).
  static MemoryPlan plan(const DiTConfig& cfg, const DiTShape& shape, int experts, size_t attn_workspace = 0,
                         const dist::Layout& par = {}, Gemm gemm = Gemm::Bf16, WeightResidency residency = {});
  // The residencies a budget is tried with, cheapest first: Resident, SwapExperts (more than one
  // expert), StreamBlocks with 3 slots (copies fully hidden behind two blocks of compute), then 2, from
  // disk, then streaming with the rows in 4 and 16 chunks (from pinned memory, then from disk).
  static std::vector<WeightResidency> residencies(int experts);

  DiTGpu(DiTGpu&&) noexcept;
  DiTGpu& operator=(DiTGpu&&) noexcept;
  ~DiTGpu();

  // Velocity prediction out[B, out_dim, T, H, W] f32 (host or device memory) of expert `expert` for
  // `shape`. Ordered on `stream` (may be 0); returns without synchronising when out is device memory.
  void forward(int expert, const DiTShape& shape, const DiTInputs& in, float* out, cudaStream_t stream);

  // The same forward, run eagerly with events around every GEMM and attention (see the invariants and
  // OpProfile), then synchronised and summed on the host. The output is bit-identical to forward()'s.
  // When (expert, shape) has never run, one unprofiled eager forward runs first so the plan building
  // (host work) stays out of the timings. Graphs already captured are left as they are. Throws
  // wan::Error when `stream` is being captured into a CUDA graph or the sequence is split over ranks.
  OpProfile profile_forward(int expert, const DiTShape& shape, const DiTInputs& in, float* out, cudaStream_t stream);

  // Warm-up: allocates a deferred arena, then builds every cuBLASLt / cuDNN plan and captures
  // and instantiates the CUDA graph of each (expert, shape) without running it. Capture records
  // pointers, not data, so it may run while the weights are still streaming in; the first forward of
  // such an (expert, shape) then replays the graph (bit-identical to an eager forward).
  void warm_up(const std::vector<std::pair<int, DiTShape>>& uses);

  const MemoryPlan& memory_plan() const;
  const DiTConfig& config() const;
  int experts() const;
  void set_use_graphs(bool on);   // off: every forward runs eagerly (for tests and profiling)
  size_t graphs_captured() const; // distinct (expert, shape) graphs instantiated so far
  // A copy of one weight as stored (on the device, or in the residency's host memory), converted to an
  // F32 host tensor with its official shape (for CPU references of random-weight models); an e4m3 weight
  // comes back dequantised.
  Tensor download_weight(int expert, const std::string& official_name) const;
  // Expert `expert`'s weight allocation (laid out as weights_gpu.h's DeviceTable) and its size in
  // *bytes: for filling an external source and for collectives over the weights. Resident only.
  void* weight_allocation(int expert, size_t* bytes = nullptr) const;

  // Sharded loading (pipeline/generate_parallel.h), without the internal weight table:
  // weight_ranges: the (byte offset, bytes) units of one expert's weight allocation for `cfg` and
  // `gemm`, ascending by offset and disjoint (every expert of a config has this layout), and the
  // allocation's size in *total_bytes. A unit is one tensor, or with Gemm::Fp8 a whole fusion group of
  // e4m3 weights with the row scales placed after it, so a share's owner writes and broadcasts
  // the weights and their scales together. Pure host arithmetic.
  static std::vector<std::pair<size_t, size_t>> weight_ranges(const DiTConfig& cfg, size_t* total_bytes = nullptr,
                                                              Gemm gemm = Gemm::Bf16);
  // Adds to `loader` (not started) the tensors of expert `expert` whose first byte lies in [begin, end)
  // of its weight allocation, as completion group `group`: streamed from the files where `span` gives
  // their stored bytes, else read through `get` (errors name "DiT expert <expert> weight <name>").
  // Returns how many were added. The caller starts the loader and waits for it before any forward.
  int add_weight_loads(int expert, size_t begin, size_t end, const DiTWeightGetter& get, const DiTWeightSpan& span,
                       DeviceLoader& loader, int group, const WeightMergeFn& merge = {}) const;

  struct Impl;

 private:
  explicit DiTGpu(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace wan::cuda
