// GPU side of `wan bench` (src/bench/cmd_bench.cpp): times the GPU DiT forward (DiTGpu, random weights
// drawn on the GPU, batch-2 CFG) and breaks a step down into GEMM, attention and everything else.
//
// Two measurements, kept apart on purpose:
// - time_forward(): whole forwards of a DiTGpu as the sampler runs them (CUDA-graph replay unless
//   graphs are off), each bracketed by CUDA events on the caller's stream, inputs and output resident
//   on the device (the input/output copies inside forward() are part of the step and are counted).
// - time_ops_isolated(): the per-op breakdown, replaying the op sequence of one block and of the
//   non-block parts with the same kernels on buffers of the same shapes (see its declaration).
// Invariants: every buffer is filled with random values (never zeros: they can run faster); all memory
// is freed before returning (the breakdown and the model are never resident together). A shape with
// DiTShape::first_frame_t (TI2V image mode) is timed with its second timestep in both measurements.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "models/config.h"
#include "models/dit/dit_gpu.h"

namespace wan::cuda {

// The timesteps of the timed forwards: every sample at kBenchTimestep (the first step of a 40-step
// schedule); with DiTShape::first_frame_t latent frame 0's tokens at kBenchFirstFrameTimestep (TI2V image
// mode: the conditioning frame is clean).
constexpr float kBenchTimestep = 937.0f, kBenchFirstFrameTimestep = 0.0f;

struct BenchDevice {
  std::string name;
  int sm_count = 0;
  size_t total_bytes = 0;
  int driver_version = 0, runtime_version = 0, cudnn_version = 0, cublaslt_version = 0;
};
BenchDevice bench_device(int device);

enum class OpKind : uint8_t { Gemm, Attention, Other };
const char* op_kind_name(OpKind k);  // "gemm", "attention", "other"

struct OpTime {
  std::string name;
  OpKind kind = OpKind::Other;
  bool per_block = true;  // false: once per forward (embeddings, head, input/output staging)
  double ms = 0;          // median over reps
  double flops = 0;       // 2·M·N·K for GEMMs, 4·B·Lq·Lk·D for attention, 0 otherwise
};
struct OpBreakdown {
  std::string mode;  // "graph": the sequence captured once and replayed; "eager": launched op by op
  std::vector<OpTime> ops;
  int reps = 0;
  double block_total_ms = 0;  // median of one block, events at its two ends
  double block_ms(OpKind k) const;     // sum of the per-block ops of kind k
  double nonblock_ms(OpKind k) const;  // sum of the once-per-forward ops of kind k
  double block_flops(OpKind k) const;
};
struct IsolatedTimings {
  OpBreakdown graph;        // empty ops when the capture failed (graph_error says why)
  OpBreakdown eager;
  std::string graph_error;
  std::string self_attention_engine;  // "own (sm_90a ...)" or cuDNN's engine (CudnnAttention::describe)
};
// DiTGpu has no hooks inside its graph, so the breakdown replays the op sequence of one block and of the
// non-block parts (patch/time/text embedding, head) with the same kernels, GEMM runner and cuDNN
// attention on buffers of the same shapes, an event between every two ops, and takes the per-op median
// over `reps` runs. The sequence mirrors DiTGpu::Impl::block / run_body (src/models/dit/dit_gpu.cpp);
// if those change, change the op list in time_ops_isolated (dit_bench_gpu.cpp) too. The isolated step
// model (layers x block + non-block) is printed next to the measured step so a drift between the two
// is visible.
// Times the op sequence eagerly and as one captured CUDA graph with event-record nodes between the ops
// (the way the step runs). Needs about the activation arena of the shape plus one block's weights free.
// `attention` picks the kernel timed for the attention ops (resolved as DiTGpu::resolve_attention).
IsolatedTimings time_ops_isolated(const DiTConfig& cfg, const DiTShape& shape, int reps, uint64_t seed, int device,
                                  DiTGpu::Attention attention = DiTGpu::Attention::Auto);

struct ForwardTiming {
  int layers = 0;
  bool graphs = true;
  std::vector<double> step_ms;  // every timed forward, in order
  double median_ms = 0, mean_ms = 0, min_ms = 0;
  double create_s = 0;          // DiTGpu::create (plan, allocation, random weight draw)
  double warmup_s = 0;          // the warm-up forwards (the first builds every plan, the second captures)
  MemoryPlan plan;
  size_t device_used_before = 0;  // total - free before create (context, other processes)
  size_t device_used_peak = 0;    // max of total - free sampled after create and after every forward
};
// cfg.num_layers blocks; `warmup` untimed forwards first (>= 1: the first forward is the eager one
// that builds the cuBLASLt/cuDNN plans; with graphs the second captures), then `steps` timed ones.
// `parallel`: one rank of a multi-GPU forward; every rank of the layout calls time_forward
// with the same arguments (same seed: the weights and inputs are the same on every rank), and each
// rank's step time includes its waits on the others.
// `experts` random experts are created with `residency` (issue 27's low-memory mode; the steps run expert
// 0, whose weights a swap then holds).
// `after_steps`, when set, runs after the timed forwards on the same model, inputs and stream, before the
// model is freed (`wan bench` runs its in-step op profile there: DiTGpu::profile_forward).
using AfterSteps = std::function<void(DiTGpu& gpu, const DiTInputs& in, float* out, cudaStream_t stream)>;
ForwardTiming time_forward(const DiTConfig& cfg, const DiTShape& shape, int warmup, int steps, bool graphs,
                           uint64_t seed, int device, bool verbose,
                           DiTGpu::Attention attention = DiTGpu::Attention::Auto,
                           const DiTGpu::Options::Parallel& parallel = {}, const AfterSteps& after_steps = {},
                           DiTGpu::Gemm gemm = DiTGpu::Gemm::Bf16, WeightResidency residency = {},
                           int experts = 1);

// "own", "own-fp8" or "cudnn": what a resolved attention kernel is called in output and JSON.
const char* attention_label(DiTGpu::Attention a);

// The relative L2 distance of one forward's output (the bench's random weights and inputs of `seed`, after
// one graph warm-up) with `attention` and `gemm` from the exact one (bf16 GEMMs, the own bf16 attention,
// or cuDNN where the own kernel is unsupported): the end-to-end error of a lossy mode at full width. The two
// models are built one after the other (one fits at a time).
double forward_error_vs_exact(const DiTConfig& cfg, const DiTShape& shape, uint64_t seed, int device,
                              DiTGpu::Attention attention, DiTGpu::Gemm gemm);

}  // namespace wan::cuda
