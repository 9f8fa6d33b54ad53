// `wan bench-attention`: the engine's two attention kernels (OwnAttention, src/kernels/attention_own.h, and
// CudnnAttention, src/kernels/attention_cudnn.h) timed side by side at the DiT's shapes
// (bench/run_attention_bench.sh runs bench/baselines/torch_sdpa.py on the same cases next).
// Cases (B = 2, H = 40, D = 128, bf16; the list bench/baselines/torch_sdpa.py repeats by name): all_cases().
// What is measured (say it, so numbers are never mistaken for something else):
// - inputs: random bf16 ~ N(0, S²) (S = --input-std) drawn on the GPU, one seed per case (run_case);
// - time: CUDA events around each call, interleaved own/cuDNN after a cold-L2 fill (time_interleaved);
// - TFLOP/s = 4·B·H·Lq·Lk·D / time (masked: Lk replaced by the valid keys, Σ_b k_lens[b] / B);
//   speed-up = cuDNN median / own median;
// - sanity (not a correctness test: tests/gpu/test_attention_own.cu is): every 37th output token row of
//   both kernels is downloaded, must be finite, and their max abs difference is reported.
// Without an sm_90 GPU (or a build without the sm_90a kernel) only cuDNN is timed, and the output and the
// JSON say so. In a build without CUDA, or on a machine without a GPU, the command fails with one clear error.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "bench/commands.h"
#include "core/dtype.h"
#include "core/error.h"
#include "pipeline/files.h"

#ifdef WAN_HAVE_CUDA
#include "kernels/attention_cudnn.h"
#include "kernels/attention_fp8.h"
#include "kernels/attention_own.h"
#include "kernels/check.h"
#include "bench/dit_bench_gpu.h"
#include "kernels/rng.h"
#endif

namespace wan::cli {
namespace {

constexpr int64_t kB = 2, kH = 40, kD = 128;

struct CaseDef {
  const char* name;
  bool self;    // fused QKV views (Lk = Lq) or dense cross-attention
  int64_t Lq, Lk;
  std::vector<int32_t> k_lens;  // empty: unmasked
};

// self-*: Q/K/V as views of one fused [B, L, 3, H, 128] buffer (token stride 3·H·128: the engine layout;
// 75601 is odd); cross-*: dense Q [B, Lq, H, 128] and dense K, V [B, 512, H, 128] (separate buffers);
// cross-masked: as cross-75600x512 with k_lens = {300, 512}.
const std::vector<CaseDef>& all_cases() {
  static const std::vector<CaseDef> c = {
      {"self-75600", true, 75600, 75600, {}},
      {"self-32760", true, 32760, 32760, {}},
      {"self-75601", true, 75601, 75601, {}},
      {"cross-75600x512", false, 75600, 512, {}},
      {"cross-32760x512", false, 32760, 512, {}},
      {"cross-masked-75600x512", false, 75600, 512, {300, 512}},
  };
  return c;
}

std::string case_names() {
  std::string s;
  for (const CaseDef& c : all_cases()) s += (s.empty() ? "" : ", ") + std::string(c.name);
  return s;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// The command line, read and checked before any device work.
struct AttnSettings {
  std::vector<CaseDef> cases;
  long long reps = 0, warmup = 0, device = 0;
  double input_std = 1;
  std::string json_path;
  bool fp8 = false;  // --attention own-fp8: the "own" slot times the FP8 kernel (quantisation passes included)
};

// --cases in the order given (a repeated name once), or all of them.
std::vector<CaseDef> selected_cases(const api::Values& args) {
  const auto sel = args.get("cases");
  if (!sel) return all_cases();
  std::vector<CaseDef> cases;
  for (const std::string& name : split_commas(*sel)) {
    const auto it =
        std::find_if(all_cases().begin(), all_cases().end(), [&](const CaseDef& c) { return name == c.name; });
    WAN_CHECK(it != all_cases().end(), "--cases: unknown case '", name, "' (valid: ", case_names(), ")");
    const bool dup = std::any_of(cases.begin(), cases.end(), [&](const CaseDef& c) { return name == c.name; });
    if (!dup) cases.push_back(*it);
  }
  WAN_CHECK(!cases.empty(), "--cases: no case named (valid: ", case_names(), ")");
  return cases;
}

AttnSettings parse_settings(const api::Values& args) {
  AttnSettings s;
  s.cases = selected_cases(args);
  s.reps = args.get_int("reps", 10), s.warmup = args.get_int("warmup", 2);
  s.device = args.device("device");
  s.input_std = args.get_double("input-std", 1.0);
  s.json_path = args.get_or("json", "");
  s.fp8 = args.str("attention") == "own-fp8";
  if (!s.json_path.empty()) check_output_path(s.json_path, "--json");  // before any work
  return s;
}

#ifdef WAN_HAVE_CUDA
using namespace wan::cuda;

struct Events {
  cudaEvent_t fill = nullptr, start = nullptr, stop = nullptr;
  Events() {
    CUDA_CHECK(cudaEventCreate(&fill));
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~Events() {
    cudaEventDestroy(fill);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
};

struct KernelTimes {
  std::vector<double> ms;          // per timed call (CUDA events around the call)
  std::vector<double> enqueue_us;  // host time of the run() call itself
  std::vector<double> fill_ms;     // the untimed fill before the call (it must outlast the enqueue)
  nlohmann::json to_json(double flops) const {
    const double med = median_of(ms), mn = ms.empty() ? 0 : *std::min_element(ms.begin(), ms.end());
    return {{"ms", ms},
            {"median_ms", med},
            {"min_ms", mn},
            {"tflops", med > 0 ? flops / (med * 1e9) : 0.0},
            {"tflops_at_min", mn > 0 ? flops / (mn * 1e9) : 0.0},
            {"host_enqueue_us_median", median_of(enqueue_us)},
            {"host_enqueue_us_max", enqueue_us.empty() ? 0.0 : *std::max_element(enqueue_us.begin(), enqueue_us.end())},
            {"fill_ms_median", median_of(fill_ms)}};
  }
};

// Max abs difference, non-finite count and max |x| over every `step`-th token row of two [rows, HD] bf16
// outputs (downloaded with a strided 2D copy).
struct Compare {
  double max_abs_diff = 0, max_abs = 0;
  size_t nonfinite_own = 0, nonfinite_cudnn = 0, rows = 0;
};
std::vector<uint16_t> sample_rows(const uint16_t* d, int64_t rows, int64_t row_elems, int64_t step) {
  const int64_t n = (rows + step - 1) / step;
  std::vector<uint16_t> h(static_cast<size_t>(n * row_elems));
  const size_t w = static_cast<size_t>(row_elems) * sizeof(uint16_t);
  CUDA_CHECK(cudaMemcpy2D(h.data(), w, d, w * static_cast<size_t>(step), w, static_cast<size_t>(n),
                          cudaMemcpyDeviceToHost));
  return h;
}

constexpr const char* kOwnSwitches[] = {"WAN_ATTN_BN",        "WAN_ATTN_PERSIST",    "WAN_ATTN_PINGPONG",
                                        "WAN_ATTN_FP8_POLY",  "WAN_ATTN_FP8_STAGES", "WAN_ATTN_FP8_LAZY"};

// The device and what it can time: the own kernel (sm_90 and the sm_90a build), cuDNN, and why not.
struct AttnDevice {
  int dev = 0;
  BenchDevice bd;
  cudaDeviceProp prop{};
  bool own_ok = false, cudnn_ok = false;
  std::string own_note, cudnn_note;
};

AttnDevice open_device(long long device) {
  AttnDevice d;
  d.dev = select_bench_device(device, "wan bench-attention: no CUDA device is visible (it times GPU kernels)");
  d.bd = bench_device(d.dev);
  CUDA_CHECK(cudaGetDeviceProperties(&d.prop, d.dev));
  d.own_ok = OwnAttention::supported();
  d.cudnn_ok = cudnn_available();
  d.own_note = d.own_ok ? "" : cat("own kernel unsupported on this device (sm_", d.prop.major, d.prop.minor,
                                   "; it needs sm_90 and a build with the sm_90a kernel): not timed");
  d.cudnn_note = d.cudnn_ok ? "" : "cuDNN unavailable (this build has no cuDNN): not timed";
  WAN_CHECK(d.own_ok || d.cudnn_ok, "wan bench-attention: nothing to time on device ", d.dev, " (", d.bd.name, "): ",
            d.own_note, "; ", d.cudnn_note);
  return d;
}

void print_intro(const AttnSettings& s, const AttnDevice& d) {
  printf("wan bench-attention: B=%lld H=%lld D=%lld bf16 inputs ~ N(0, %g^2), %lld warm-up + %lld timed calls per "
         "kernel (interleaved own/cuDNN), CUDA events, median\n",
         (long long)kB, (long long)kH, (long long)kD, s.input_std, s.warmup, s.reps);
  if (s.fp8) printf("own = the FP8 kernel (--attention own-fp8): e4m3 Q/K/V/P, its quantisation passes timed too\n");
  printf("device %d: %s (sm_%d%d), %d SMs, %.1f GiB; driver %d, runtime %d, cuDNN %d\n", d.dev, d.bd.name.c_str(),
         d.prop.major, d.prop.minor, d.bd.sm_count, d.bd.total_bytes / (1024.0 * 1024.0 * 1024.0),
         d.bd.driver_version, d.bd.runtime_version, d.bd.cudnn_version);
  if (!d.own_ok) printf("NOTE: %s; timing cuDNN only\n", d.own_note.c_str());
  if (!d.cudnn_ok) printf("NOTE: %s; timing the own kernel only\n", d.cudnn_note.c_str());
  for (const char* k : kOwnSwitches)
    if (const char* v = std::getenv(k)) printf("NOTE: %s=%s is set (an experiment switch of the own kernel)\n", k, v);
  fflush(stdout);
}

// What every case shares: the cuDNN runner, the stream and the pre-call fill: 256 MiB of bf16 (5x the H100's
// L2), whose time is recorded and compared with the launch's host work.
struct AttnRig {
  struct Stream {
    cudaStream_t s = nullptr;
    ~Stream() {
      if (s) cudaStreamDestroy(s);
    }
  };
  std::optional<CudnnAttention> cudnn;
  Stream stream;
  std::optional<DevMem<uint16_t>> scratch;
  uint64_t fill_seed = 0xF111;
  float case_std = 1;  // the cases' Q/K/V (the pre-call fill stays N(0, 1))

  AttnRig(bool cudnn_ok, double input_std) : case_std(static_cast<float>(input_std)) {
    if (cudnn_ok) cudnn.emplace();
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream.s, cudaStreamNonBlocking));
    scratch.emplace(size_t{128} << 20);
  }
};

// The attention shape of a case (B, H, D fixed); self-attention reads Q/K/V as views of fused QKV rows.
AttentionShape case_shape(const CaseDef& c) {
  AttentionShape s;
  s.B = kB, s.Lq = c.Lq, s.Lk = c.Lk, s.H = kH, s.D = kD;
  s.masked = !c.k_lens.empty();
  if (c.self) s.q_ld = s.k_ld = s.v_ld = 3 * kH * kD;  // views of the fused QKV rows (before the plan is built)
  return s;
}

// Σ_b 4·H·Lq·k_len_b·D (unmasked: every key of every sample).
double case_flops(const CaseDef& c) {
  int64_t valid_keys = kB * c.Lk;
  if (!c.k_lens.empty()) {
    valid_keys = 0;
    for (int32_t k : c.k_lens) valid_keys += k;
  }
  return 4.0 * kH * c.Lq * kD * static_cast<double>(valid_keys);
}

// --warmup untimed calls of each kernel, then --reps timed ones interleaved rep by rep (own, cuDNN, own, ...)
// so that clock and power drift hit both alike. Before every timed call an untimed 256 MiB random fill runs
// on the same stream: the host-side launch work (tensor maps, cuDNN variant pack) overlaps it, so the events
// see the kernel and not the host (the DiT runs these in CUDA graphs), and both kernels start with a cold
// L2. The host enqueue time of each call and the fill time are recorded so that this can be checked.
template <typename Launch>
void time_interleaved(const Launch& launch, const std::vector<bool>& order, const AttnSettings& s, AttnRig& rig,
                      KernelTimes& t_own, KernelTimes& t_cudnn) {
  const cudaStream_t st = rig.stream.s;
  for (long long w = 0; w < s.warmup; ++w)
    for (bool own : order) launch(own);
  CUDA_CHECK(cudaStreamSynchronize(st));
  Events ev;
  for (long long r = 0; r < s.reps; ++r) {
    for (bool own : order) {
      CUDA_CHECK(cudaEventRecord(ev.fill, st));
      cuda::philox_normal_fill_bf16(rig.scratch->p, rig.scratch->n, rig.fill_seed++, 0, 1.0f, st);
      CUDA_CHECK(cudaEventRecord(ev.start, st));
      const auto h0 = std::chrono::steady_clock::now();
      launch(own);
      const double enq_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count();
      CUDA_CHECK(cudaEventRecord(ev.stop, st));
      CUDA_CHECK(cudaEventSynchronize(ev.stop));
      float ms = 0, fill_ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, ev.start, ev.stop));
      CUDA_CHECK(cudaEventElapsedTime(&fill_ms, ev.fill, ev.start));
      KernelTimes& t = own ? t_own : t_cudnn;
      t.ms.push_back(ms);
      t.enqueue_us.push_back(enq_us);
      t.fill_ms.push_back(fill_ms);
    }
  }
}

// Sanity: every `step`-th output token row of the kernels that ran (null: not run) finite; own vs cuDNN.
Compare compare_outputs(const uint16_t* o_own, const uint16_t* o_cudnn, int64_t rows, int64_t HD, int64_t step) {
  Compare cmp;
  std::vector<uint16_t> h_own, h_cudnn;
  if (o_own) h_own = sample_rows(o_own, rows, HD, step);
  if (o_cudnn) h_cudnn = sample_rows(o_cudnn, rows, HD, step);
  cmp.rows = static_cast<size_t>((rows + step - 1) / step);
  for (size_t i = 0; i < std::max(h_own.size(), h_cudnn.size()); ++i) {
    const float x = h_own.empty() ? 0.f : bf16_to_f32(h_own[i]);
    const float y = h_cudnn.empty() ? 0.f : bf16_to_f32(h_cudnn[i]);
    cmp.nonfinite_own += !std::isfinite(x);
    cmp.nonfinite_cudnn += !std::isfinite(y);
    if (std::isfinite(x) && std::isfinite(y)) {
      cmp.max_abs = std::max(cmp.max_abs, static_cast<double>(std::fabs(h_cudnn.empty() ? x : y)));
      if (!h_own.empty() && !h_cudnn.empty())
        cmp.max_abs_diff = std::max(cmp.max_abs_diff, static_cast<double>(std::fabs(x - y)));
    }
  }
  return cmp;
}

// One case's measurements.
struct CaseRun {
  uint64_t seed = 0;
  double flops = 0;
  bool own = false, cudnn = false;  // which kernels ran
  KernelTimes t_own, t_cudnn;
  std::string cudnn_engine;
  size_t ws = 0;  // the cuDNN workspace
  size_t fp8_ws = 0;  // the FP8 kernel's (--attention own-fp8)
  Compare cmp;
  int64_t row_step = 37;  // the sampled output rows
  bool bad() const { return cmp.nonfinite_own || cmp.nonfinite_cudnn; }
};

// Allocates and fills the case's inputs (cuda::philox_normal_fill_bf16; keys past k_lens hold random
// values too; the cuDNN workspace is sized by workspace_size(), which also builds the plan, outside the
// timing), times both kernels on them and compares their outputs.
CaseRun run_case(const CaseDef& c, size_t ci, const AttnDevice& d, AttnRig& rig, const AttnSettings& set) {
  CaseRun run;
  const int64_t HD = kH * kD, Lq = c.Lq, Lk = c.Lk;
  const bool masked = !c.k_lens.empty();
  WAN_ASSERT(!masked || static_cast<int64_t>(c.k_lens.size()) == kB, "bench-attention: k_lens of ", c.name);
  run.seed = 0xA770 + 16 * ci;
  run.own = d.own_ok, run.cudnn = rig.cudnn.has_value();
  const bool fp8 = set.fp8;
  const cudaStream_t st = rig.stream.s;

  const AttentionShape s = case_shape(c);
  const size_t q_elems = static_cast<size_t>(kB * Lq * (c.self ? 3 * HD : HD));
  const size_t kv_elems = c.self ? 0 : static_cast<size_t>(2 * kB * Lk * HD);
  const size_t o_elems = static_cast<size_t>(kB * Lq * HD);
  if (rig.cudnn) {
    run.ws = rig.cudnn->workspace_size(s);  // builds the plan (not timed)
    run.cudnn_engine = rig.cudnn->describe(s);
  }
  {
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (fp8) run.fp8_ws = OwnAttentionFp8::workspace_size(s);
    const size_t need =
        (q_elems + kv_elems + 2 * o_elems) * sizeof(uint16_t) + run.ws + run.fp8_ws + (size_t{256} << 20);
    WAN_CHECK(need <= free_b, "bench-attention: case ", c.name, " needs about ", need >> 20, " MiB of device memory, ",
              free_b >> 20, " MiB free");
  }
  DevMem<uint16_t> qbuf(q_elems), kvbuf(kv_elems), o_own(o_elems), o_cudnn(o_elems);
  DevMem<uint8_t> dws(run.ws), dws_fp8(run.fp8_ws);
  DevMem<int32_t> dklens(masked ? static_cast<size_t>(kB) : 0);
  cuda::philox_normal_fill_bf16(qbuf.p, qbuf.n, run.seed, 0, rig.case_std, st);
  if (!c.self) cuda::philox_normal_fill_bf16(kvbuf.p, kvbuf.n, run.seed + 1, 0, rig.case_std, st);
  if (masked)
    CUDA_CHECK(cudaMemcpyAsync(dklens.p, c.k_lens.data(), kB * sizeof(int32_t), cudaMemcpyHostToDevice, st));
  CUDA_CHECK(cudaStreamSynchronize(st));

  AttentionArgs a;
  a.q = qbuf.p;
  a.k = c.self ? qbuf.p + HD : kvbuf.p;
  a.v = c.self ? qbuf.p + 2 * HD : kvbuf.p + static_cast<size_t>(kB * Lk * HD);
  a.k_lens = masked ? dklens.p : nullptr;
  AttentionArgs a_own = a, a_cudnn = a;
  a_own.o = o_own.p;
  a_cudnn.o = o_cudnn.p;
  if (d.own_ok) fp8 ? OwnAttentionFp8::validate(s) : OwnAttention::validate(s);
  run.flops = case_flops(c);

  auto launch = [&](bool own) {
    if (own && fp8) OwnAttentionFp8::run(s, a_own, dws_fp8.p, run.fp8_ws, st);
    else if (own) OwnAttention::run(s, a_own, st);
    else rig.cudnn->run(s, a_cudnn, dws.p, run.ws, st);
  };
  std::vector<bool> order;
  if (d.own_ok) order.push_back(true);
  if (rig.cudnn) order.push_back(false);
  time_interleaved(launch, order, set, rig, run.t_own, run.t_cudnn);
  run.cmp = compare_outputs(d.own_ok ? o_own.p : nullptr, rig.cudnn ? o_cudnn.p : nullptr, kB * Lq, HD, run.row_step);
  return run;
}

// The case's table row, and warnings when the timing or the outputs cannot be trusted.
void print_case(const CaseDef& c, const CaseRun& run) {
  const double own_med = median_of(run.t_own.ms), cud_med = median_of(run.t_cudnn.ms);
  const bool both = run.own && run.cudnn;
  char diff_str[32] = "-";
  if (both) std::snprintf(diff_str, sizeof diff_str, "%.3g", run.cmp.max_abs_diff);
  auto fmt = [](bool have, double v, const char* f) {
    char b[32] = "-";
    if (have) std::snprintf(b, sizeof b, f, v);
    return std::string(b);
  };
  printf("%-24s %10s %9s %10s %9s %9s %11s\n", c.name, fmt(run.own, own_med, "%.3f").c_str(),
         fmt(run.own, run.flops / (own_med * 1e9), "%.1f").c_str(), fmt(run.cudnn, cud_med, "%.3f").c_str(),
         fmt(run.cudnn, run.flops / (cud_med * 1e9), "%.1f").c_str(), fmt(both, cud_med / own_med, "%.3fx").c_str(),
         diff_str);
  // The fill must outlast the host work of the launch, else the event pair includes a host gap.
  for (const auto* t : {&run.t_own, &run.t_cudnn}) {
    if (t->ms.empty()) continue;
    const double enq = median_of(t->enqueue_us) * 1e-3, fill = median_of(t->fill_ms);
    if (enq > fill)
      printf("  WARNING: %s: host enqueue %.3f ms > pre-call fill %.3f ms: the time may include a host gap\n",
             t == &run.t_own ? "own" : "cuDNN", enq, fill);
  }
  if (run.bad())
    printf("  ERROR: non-finite outputs in the sampled rows: own %zu, cuDNN %zu\n", run.cmp.nonfinite_own,
           run.cmp.nonfinite_cudnn);
  fflush(stdout);
}

nlohmann::json case_json(const CaseDef& c, const CaseRun& run) {
  const bool masked = !c.k_lens.empty(), both = run.own && run.cudnn;
  const double own_med = median_of(run.t_own.ms), cud_med = median_of(run.t_cudnn.ms);
  const Compare& cmp = run.cmp;
  return {{"name", c.name},
          {"kind", c.self ? "self" : "cross"},
          {"layout", c.self ? "q/k/v views of one fused [B, L, 3, H, D] buffer (token stride 3*H*D)"
                            : "dense q [B, Lq, H, D], dense k and v [B, Lk, H, D] (separate)"},
          {"B", kB},
          {"H", kH},
          {"D", kD},
          {"Lq", c.Lq},
          {"Lk", c.Lk},
          {"k_lens", masked ? nlohmann::json(c.k_lens) : nlohmann::json(nullptr)},
          {"flops", run.flops},
          {"seed", run.seed},
          {"own", run.own ? run.t_own.to_json(run.flops) : nlohmann::json(nullptr)},
          {"cudnn", run.cudnn ? run.t_cudnn.to_json(run.flops) : nlohmann::json(nullptr)},
          {"cudnn_engine", run.cudnn_engine},
          {"cudnn_workspace_bytes", run.ws},
          {"speedup_own_over_cudnn", both ? nlohmann::json(cud_med / own_med) : nlohmann::json(nullptr)},
          {"check", {{"sampled_rows", cmp.rows},
                     {"row_step", run.row_step},
                     {"max_abs_diff_own_cudnn", both ? nlohmann::json(cmp.max_abs_diff) : nlohmann::json(nullptr)},
                     {"max_abs_output", cmp.max_abs},
                     {"nonfinite_own", cmp.nonfinite_own},
                     {"nonfinite_cudnn", cmp.nonfinite_cudnn}}}};
}

nlohmann::json result_json(const AttnSettings& s, const AttnDevice& d, const nlohmann::json& jcases) {
  nlohmann::json J;
  put_tool_header(J, "wan bench-attention");
  J["device"] = bench_device_json(d.bd);
  J["device"]["sm"] = cat(d.prop.major, d.prop.minor);
  J["own_supported"] = d.own_ok;
  J["own_kernel"] = s.fp8 ? "own-fp8 (e4m3 Q/K/V/P, quantisation passes included in the time)" : "own (bf16)";
  J["env"] = nlohmann::json::object();  // the own kernel's experiment switches (attention_own.cu), when set
  for (const char* k : kOwnSwitches)
    if (const char* v = std::getenv(k)) J["env"][k] = v;
  J["cudnn_available"] = d.cudnn_ok;
  J["notes"] = nlohmann::json::array();
  if (!d.own_ok) J["notes"].push_back(d.own_note);
  if (!d.cudnn_ok) J["notes"].push_back(d.cudnn_note);
  J["warmup"] = s.warmup;
  J["reps"] = s.reps;
  J["input_std"] = s.input_std;
  J["method"] =
      "random bf16 N(0, input_std^2) inputs drawn on the GPU; CUDA events around each OwnAttention::run / "
      "CudnnAttention::run on one stream, each preceded by an untimed 256 MiB fill (host launch work overlapped, "
      "cold L2); warm-up calls, then reps interleaved own/cuDNN; median; TFLOP/s = 4*B*H*Lq*Lk*D / median "
      "(masked: valid keys)";
  J["cases"] = jcases;
  return J;
}
#endif  // WAN_HAVE_CUDA

}  // namespace

const api::CommandSpec& bench_attention_spec() {
  static const api::CommandSpec s = [] {
    using api::Kind;
    api::CommandSpec c;
    c.name = "bench-attention";
    c.summary = "time the own and the cuDNN attention kernels (ms, TFLOP/s)";
    c.usage = {"bench-attention [options]"};
    c.about =
        "Times the engine's own Hopper attention kernel and cuDNN's fused attention (the engine's two paths) "
        "on random bf16 inputs at the DiT's shapes: B = 2, H = 40, D = 128.";
    api::Option input_std = api::option("input-std", Kind::Float, "S", "1",
                                        "standard deviation of the random Q/K/V (the scores' spread, and with it the "
                                        "softmax's sharpness and the tensor cores' power draw, follow it)");
    input_std.check = [](const std::string& t) {
      const double v = std::strtod(t.c_str(), nullptr);
      return v > 0 && v <= 64 ? std::string() : cat("{} ", t, ": expected a value in (0, 64]");
    };
    api::Option attention = api::option("attention", Kind::Enum, "K", "own",
                                        "the engine kernel in the \"own\" columns: own (bf16, exact) | own-fp8 (e4m3 "
                                        "Q/K/V/P with its quantisation passes, opt-in, lossy)");
    attention.choices = {"own", "own-fp8"};
    c.options = {
        api::option("cases", Kind::List, "", "all", "cases to run: " + case_names()),
        bench_int_option("reps", "10", 1, 1000, "timed calls of each kernel, interleaved own/cuDNN (median and min)"),
        bench_int_option("warmup", "2", 0, 100, "untimed calls of each kernel first"),
        bench_device_option(),
        input_std,
        attention,
        bench_json_option(),
    };
    c.epilog =
        "self-*: Q/K/V are views of one fused [B, L, 3, H, 128] buffer (the engine layout);\n"
        "cross-*: dense Q [B, Lq, H, 128] and dense K, V [B, 512, H, 128]; cross-masked: k_lens {300, 512}.\n"
        "TFLOP/s = 4*B*H*Lq*Lk*D / time (masked: the valid keys). Needs an sm_90 GPU for the own kernel;\n"
        "elsewhere only cuDNN is timed.\n";
    return c;
  }();
  return s;
}

int cmd_bench_attention(int argc, char** argv) {
  const api::Values args = api::parse_argv(bench_attention_spec(), argc, argv);
  if (api::print_help_if_asked(args, bench_attention_spec())) return 0;
  const AttnSettings s = parse_settings(args);
#ifndef WAN_HAVE_CUDA
  (void)s;
  WAN_THROW("wan bench-attention: this wan was built without CUDA; rebuild with a CUDA toolkit (WAN_ENABLE_CUDA=ON)");
#else
  const AttnDevice d = open_device(s.device);
  print_intro(s, d);
  AttnRig rig(d.cudnn_ok, s.input_std);
  printf("%-24s %10s %9s %10s %9s %9s %11s\n", "case", "own ms", "own TF/s", "cuDNN ms", "cuDNN TF/s", "own/cuDNN",
         "max|diff|");
  nlohmann::json jcases = nlohmann::json::array();
  std::string bad_cases;  // cases with non-finite outputs: reported after the JSON is written
  for (size_t ci = 0; ci < s.cases.size(); ++ci) {
    const CaseDef& c = s.cases[ci];
    const CaseRun run = run_case(c, ci, d, rig, s);
    print_case(c, run);
    jcases.push_back(case_json(c, run));
    if (run.bad()) bad_cases += (bad_cases.empty() ? "" : ", ") + std::string(c.name);
  }
  if (!s.json_path.empty()) write_json_file(s.json_path, result_json(s, d, jcases));
  WAN_ASSERT(bad_cases.empty(), "bench-attention: non-finite outputs in ", bad_cases);
  return 0;
#endif
}

}  // namespace wan::cli
