// `wan bench-gemm`: the DiT's Linear layers through GemmRunner (src/kernels/gemm.h) in bf16 and in FP8
// (e4m3 with per-token / per-channel scales, cuBLASLt outer-vector scaling), side by side. What is
// measured (say it, so numbers are never mistaken for something else):
// - inputs: x [M, K] bf16 ~ N(0, 1), w [N, K] bf16 ~ N(0, 0.02²), bias [N] bf16 ~ N(0, 0.1²), drawn on the
//   GPU (Philox, one seed per case); M = --m (75600: the 720p, 81-frame token count) or 512 (text tokens);
// - fp8: the weight is quantised once before timing (offline in a real run); each call quantises x
//   (cuda::quantize_rows_fp8, timed on its own: ms and GB/s = (3·M·K + 4·M) bytes / time, next to a
//   cudaMemcpyAsync of x, GB/s = 2·(2·M·K) bytes / time: the copy bandwidth it aims for) then runs the
//   FP8 GEMM with the bias (and GELU) in cuBLASLt's epilogue or, when cuBLASLt refuses that, in the
//   separate kernel (the JSON says which), with fast accumulation, and beside it with fp32 accumulation;
// - time: CUDA events around each call on one stream, reps interleaved after warm-up, median; TFLOP/s =
//   2·M·N·K / time (fp8 also with the quantisation's time added);
// - accuracy: rel L2 of the bf16 and the fp8 outputs against cuBLAS's fp32 GEMM (no TF32) of the
//   unquantised inputs (bias in fp32, GELU on the host), on every step-th row (about 1000 rows).
// `--gemm fp8` on a GPU without FP8 GEMMs (cuda::fp8_supported) is refused; `both` then times bf16 only.
// In a build without CUDA the command parses its options and then fails with one clear error.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "bench/commands.h"
#include "core/error.h"
#include "ops/cpu_ops.h"
#include "pipeline/files.h"

#ifdef WAN_HAVE_CUDA
#include "bench/dit_bench_gpu.h"
#include "kernels/check.h"
#include "kernels/dit_kernels.h"
#include "kernels/fp8_quant.h"
#include "kernels/gemm.h"
#include "kernels/rng.h"
#endif

namespace wan::cli {
namespace {

constexpr int64_t kDim = 5120, kFfn = 13824, kTextTokens = 512;

struct GemmCase {
  const char* name;
  const char* what;
  bool token_rows;  // M = --m; else the 512 text tokens
  int64_t K, N;
  bool gelu;
};

const std::vector<GemmCase>& all_cases() {
  static const std::vector<GemmCase> c = {
      {"self-qkv", "self-attn q, k, v as the engine runs them: one GEMM", true, kDim, 3 * kDim, false},
      {"proj", "self-attn o, cross-attn q and o (each 5120 -> 5120)", true, kDim, kDim, false},
      {"ffn.0", "FFN up-projection with GELU-tanh", true, kDim, kFfn, true},
      {"ffn.2", "FFN down-projection", true, kFfn, kDim, false},
      {"cross-kv", "cross-attn k / v over the 512 text tokens", false, kDim, kDim, false},
  };
  return c;
}

// The command line, read and checked before any device work.
struct GemmSettings {
  std::string gemm, json_path;
  bool bf16 = true, fp8 = true;
  long long m = 0, reps = 0, warmup = 0, device = 0;
};

GemmSettings parse_settings(const api::Values& args) {
  GemmSettings s;
  s.gemm = args.str("gemm");
  s.bf16 = s.gemm != "fp8";
  s.fp8 = s.gemm != "bf16";
  s.m = args.get_int("m", 75600);
  s.reps = args.get_int("reps", 10);
  s.warmup = args.get_int("warmup", 2);
  s.device = args.device("device");
  s.json_path = args.get_or("json", "");
  if (!s.json_path.empty()) check_output_path(s.json_path, "--json");  // before any work
  return s;
}

#ifdef WAN_HAVE_CUDA
using namespace wan::cuda;

__nv_bfloat16* bf(uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

struct Events {
  cudaEvent_t e[6] = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
  Events() {
    for (auto& x : e) CUDA_CHECK(cudaEventCreate(&x));
  }
  ~Events() {
    for (auto& x : e) cudaEventDestroy(x);
  }
  double ms(int a, int b) const {
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, e[a], e[b]));
    return t;
  }
};

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
};

// One case's device buffers (fp8 ones empty when FP8 is not timed).
struct CaseBuffers {
  DevMem<uint16_t> x, w, bias, y16, y8, y8_acc32, x_copy;
  DevMem<uint8_t> xq, wq;
  DevMem<float> sx, sw;
  CaseBuffers(int64_t M, int64_t K, int64_t N, bool bf16, bool fp8)
      : x(M * K), w(N * K), bias(N), y16(bf16 ? M * N : 0), y8(fp8 ? M * N : 0), y8_acc32(fp8 ? M * N : 0),
        x_copy(fp8 ? M * K : 0),
        xq(fp8 ? M * K : 0), wq(fp8 ? N * K : 0), sx(fp8 ? M : 0), sw(fp8 ? N : 0) {}
  static size_t bytes(int64_t M, int64_t K, int64_t N, bool bf16, bool fp8) {
    size_t b = 2 * (M * K + N * K + N) + (bf16 ? 2 * M * N : 0);
    if (fp8) b += 4 * M * N + 3 * M * K + N * K + 4 * (M + N);
    return b;
  }
};

struct Accuracy {
  double fp8 = -1, bf16 = -1;  // rel L2 vs fp32 (-1: not run)
  double fp8_acc32 = -1;       // the FP8 GEMM with Fp8Accumulate::Fp32, vs fp32
  double fast_vs_acc32 = -1;   // the default (fast accumulation) output vs the Fp32-accumulate one
  int64_t rows = 0, step = 1;
  size_t nonfinite_fp8 = 0, nonfinite_bf16 = 0, nonfinite_fp8_acc32 = 0;
};

struct CaseRun {
  int64_t M = 0, K = 0, N = 0;
  uint64_t seed = 0;
  double flops = 0;
  std::vector<double> bf16_ms, fp8_ms, quant_ms, copy_ms, fp8_acc32_ms;
  bool fp8_separate_epilogue = false;
  Accuracy acc;
  bool bad() const { return acc.nonfinite_fp8 || acc.nonfinite_bf16 || acc.nonfinite_fp8_acc32; }
};

// Rel L2 of a downloaded [rows, N] output (bf16 bits) against the fp32 one; counts non-finite values.
double rel_l2_bf16(const std::vector<uint16_t>& got, const std::vector<float>& ref, size_t* nonfinite) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = bf16_to_f32(got[i]);
    if (!std::isfinite(g)) {
      ++*nonfinite;
      continue;
    }
    num += (g - ref[i]) * (g - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Every step-th row of x through cuBLAS's fp32 GEMM (inputs, weight and bias converted exactly), GELU on
// the host; the same rows of the bf16 and fp8 outputs downloaded with a strided copy and compared.
Accuracy measure_accuracy(const GemmCase& c, CaseRun& run, CaseBuffers& b, GemmRunner& runner, bool bf16, bool fp8,
                          cudaStream_t st) {
  const int64_t M = run.M, K = run.K, N = run.N;
  Accuracy a;
  a.step = std::max<int64_t>(1, M / 1024);
  a.rows = (M + a.step - 1) / a.step;
  DevMem<uint16_t> xs(a.rows * K);
  DevMem<float> xs32(a.rows * K), w32(N * K), b32(N), y32(a.rows * N);
  const size_t row16 = static_cast<size_t>(K) * 2;
  CUDA_CHECK(cudaMemcpy2DAsync(xs.p, row16, b.x.p, row16 * a.step, row16, a.rows, cudaMemcpyDeviceToDevice, st));
  convert_bf16_to_f32(bf(xs.p), xs32.p, a.rows * K, st);
  convert_bf16_to_f32(bf(b.w.p), w32.p, N * K, st);
  convert_bf16_to_f32(bf(b.bias.p), b32.p, N, st);
  runner.linear(xs32.p, w32.p, b32.p, y32.p, a.rows, K, N, Act::None, st);
  std::vector<float> ref(a.rows * N);
  CUDA_CHECK(cudaMemcpyAsync(ref.data(), y32.p, ref.size() * 4, cudaMemcpyDeviceToHost, st));
  CUDA_CHECK(cudaStreamSynchronize(st));
  if (c.gelu) ops::gelu_tanh(ref.data(), ref.data(), static_cast<int64_t>(ref.size()));
  auto rows_of = [&](const uint16_t* y) {
    std::vector<uint16_t> h(a.rows * N);
    const size_t w = static_cast<size_t>(N) * 2;
    CUDA_CHECK(cudaMemcpy2D(h.data(), w, y, w * a.step, w, a.rows, cudaMemcpyDeviceToHost));
    return h;
  };
  if (bf16) a.bf16 = rel_l2_bf16(rows_of(b.y16.p), ref, &a.nonfinite_bf16);
  if (fp8) {
    const std::vector<uint16_t> fast = rows_of(b.y8.p), acc32 = rows_of(b.y8_acc32.p);
    a.fp8 = rel_l2_bf16(fast, ref, &a.nonfinite_fp8);
    a.fp8_acc32 = rel_l2_bf16(acc32, ref, &a.nonfinite_fp8_acc32);
    std::vector<float> acc32_f(acc32.size());
    for (size_t i = 0; i < acc32.size(); ++i) acc32_f[i] = bf16_to_f32(acc32[i]);
    size_t counted = 0;  // fast's non-finite values again: counted above
    a.fast_vs_acc32 = rel_l2_bf16(fast, acc32_f, &counted);
  }
  return a;
}

// Draws the case's inputs, quantises the weight, warms up, then times reps of bf16 / quantise / fp8.
CaseRun run_case(const GemmCase& c, size_t ci, const GemmSettings& s, bool fp8, GemmRunner& runner, cudaStream_t st) {
  CaseRun run;
  run.M = c.token_rows ? s.m : kTextTokens, run.K = c.K, run.N = c.N;
  run.flops = 2.0 * run.M * run.N * run.K;
  run.seed = 0x6E770 + 16 * ci;
  const int64_t M = run.M, K = run.K, N = run.N;
  {
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const size_t need = CaseBuffers::bytes(M, K, N, s.bf16, fp8) + 4 * (N * K + 1100 * (K + N)) + (size_t{64} << 20);
    WAN_CHECK(need <= free_b, "bench-gemm: case ", c.name, " (M ", M, ") needs about ", need >> 20,
              " MiB of device memory, ", free_b >> 20, " MiB free (lower --m)");
  }
  CaseBuffers b(M, K, N, s.bf16, fp8);
  philox_normal_fill_bf16(b.x.p, b.x.n, run.seed, 0, 1.0f, st);
  philox_normal_fill_bf16(b.w.p, b.w.n, run.seed + 1, 0, 0.02f, st);
  philox_normal_fill_bf16(b.bias.p, b.bias.n, run.seed + 2, 0, 0.1f, st);
  if (fp8) quantize_rows_fp8(bf(b.w.p), N, K, b.wq.p, b.sw.p, st);
  const Act act = c.gelu ? Act::GeluTanh : Act::None;
  auto call_bf16 = [&] { runner.linear(bf(b.x.p), bf(b.w.p), bf(b.bias.p), bf(b.y16.p), M, K, N, act, st); };
  auto call_quant = [&] { quantize_rows_fp8(bf(b.x.p), M, K, b.xq.p, b.sx.p, st); };
  auto call_fp8 = [&] {
    runner.linear_fp8(b.xq.p, b.sx.p, b.wq.p, b.sw.p, bf(b.bias.p), bf(b.y8.p), M, K, N, act, st);
  };
  // The same FP8 GEMM with the partial sums promoted to fp32 (Fp8Accumulate::Fp32), for its time and error.
  auto call_fp8_acc32 = [&] {
    runner.set_fp8_accumulate(Fp8Accumulate::Fp32);
    runner.linear_fp8(b.xq.p, b.sx.p, b.wq.p, b.sw.p, bf(b.bias.p), bf(b.y8_acc32.p), M, K, N, act, st);
    runner.set_fp8_accumulate(Fp8Accumulate::Fast);
  };
  auto call_copy = [&] { CUDA_CHECK(cudaMemcpyAsync(b.x_copy.p, b.x.p, M * K * 2, cudaMemcpyDeviceToDevice, st)); };
  const size_t separate0 = runner.fp8_separate_epilogues();
  for (long long w = 0; w < s.warmup + 1; ++w) {  // + 1: plans and the epilogue choice are made outside timing
    if (s.bf16) call_bf16();
    if (fp8) call_quant(), call_fp8(), call_copy(), call_fp8_acc32();
  }
  CUDA_CHECK(cudaStreamSynchronize(st));
  run.fp8_separate_epilogue = runner.fp8_separate_epilogues() > separate0;
  Events ev;
  for (long long r = 0; r < s.reps; ++r) {
    CUDA_CHECK(cudaEventRecord(ev.e[0], st));
    if (s.bf16) call_bf16();
    CUDA_CHECK(cudaEventRecord(ev.e[1], st));
    if (fp8) call_quant();
    CUDA_CHECK(cudaEventRecord(ev.e[2], st));
    if (fp8) call_fp8();
    CUDA_CHECK(cudaEventRecord(ev.e[3], st));
    if (fp8) call_copy();
    CUDA_CHECK(cudaEventRecord(ev.e[4], st));
    if (fp8) call_fp8_acc32();
    CUDA_CHECK(cudaEventRecord(ev.e[5], st));
    CUDA_CHECK(cudaEventSynchronize(ev.e[5]));
    if (s.bf16) run.bf16_ms.push_back(ev.ms(0, 1));
    if (fp8) {
      run.quant_ms.push_back(ev.ms(1, 2)), run.fp8_ms.push_back(ev.ms(2, 3)), run.copy_ms.push_back(ev.ms(3, 4));
      run.fp8_acc32_ms.push_back(ev.ms(4, 5));
    }
  }
  run.acc = measure_accuracy(c, run, b, runner, s.bf16, fp8, st);
  return run;
}

double tflops(double flops, double ms) { return ms > 0 ? flops / (ms * 1e9) : 0.0; }
double quant_bytes(const CaseRun& r) { return 3.0 * r.M * r.K + 4.0 * r.M; }
double copy_bytes(const CaseRun& r) { return 4.0 * r.M * r.K; }  // 2·M·K bytes read and written

std::string fmt(bool have, double v, const char* f) {
  char b[32] = "-";
  if (have) std::snprintf(b, sizeof b, f, v);
  return b;
}

void print_header() {
  printf("%-9s %6s %6s %6s | %8s %7s | %8s %7s | %7s %7s %7s | %7s %8s | %8s %8s\n", "case", "M", "K", "N",
         "bf16 ms", "TF/s", "fp8 ms", "TF/s", "quant", "GB/s", "copy", "+q TF/s", "speed-up", "relL2 fp8", "bf16");
}

void print_case(const GemmCase& c, const CaseRun& r, bool bf16, bool fp8) {
  const double b = median_of(r.bf16_ms), f = median_of(r.fp8_ms), q = median_of(r.quant_ms), cp = median_of(r.copy_ms);
  printf("%-9s %6lld %6lld %6lld | %8s %7s | %8s %7s | %7s %7s %7s | %7s %8s | %8s %8s%s\n", c.name,
         (long long)r.M, (long long)r.K, (long long)r.N, fmt(bf16, b, "%.3f").c_str(),
         fmt(bf16, tflops(r.flops, b), "%.0f").c_str(), fmt(fp8, f, "%.3f").c_str(),
         fmt(fp8, tflops(r.flops, f), "%.0f").c_str(), fmt(fp8, q, "%.3f").c_str(),
         fmt(fp8, quant_bytes(r) / (q * 1e6), "%.0f").c_str(), fmt(fp8, copy_bytes(r) / (cp * 1e6), "%.0f").c_str(),
         fmt(fp8, tflops(r.flops, f + q), "%.0f").c_str(),
         fmt(bf16 && fp8, b / (f + q), "%.2fx").c_str(), fmt(fp8, r.acc.fp8, "%.4f").c_str(),
         fmt(bf16, r.acc.bf16, "%.1e").c_str(), fp8 && r.fp8_separate_epilogue ? "  (fp8: separate epilogue)" : "");
  if (fp8) {
    const double a = median_of(r.fp8_acc32_ms);
    printf("  fp8 with fp32 accumulation: %.3f ms, %.0f TF/s, relL2 %.4f; fast vs fp32 accumulation: relL2 %.2e\n", a,
           tflops(r.flops, a), r.acc.fp8_acc32, r.acc.fast_vs_acc32);
  }
  if (r.bad())
    printf("  ERROR: non-finite outputs in the sampled rows: fp8 %zu (fp32 accumulation %zu), bf16 %zu\n",
           r.acc.nonfinite_fp8, r.acc.nonfinite_fp8_acc32, r.acc.nonfinite_bf16);
  fflush(stdout);
}

nlohmann::json times_json(const std::vector<double>& ms, double flops) {
  const double med = median_of(ms);
  return {{"ms", ms}, {"median_ms", med}, {"tflops", tflops(flops, med)}};
}

nlohmann::json case_json(const GemmCase& c, const CaseRun& r, bool bf16, bool fp8) {
  nlohmann::json j = {{"name", c.name}, {"what", c.what}, {"M", r.M},       {"K", r.K},       {"N", r.N},
                      {"bias", true},   {"gelu", c.gelu}, {"flops", r.flops}, {"seed", r.seed}};
  j["bf16"] = bf16 ? times_json(r.bf16_ms, r.flops) : nlohmann::json(nullptr);
  if (fp8) {
    const double q = median_of(r.quant_ms), f = median_of(r.fp8_ms);
    j["fp8"] = times_json(r.fp8_ms, r.flops);
    j["fp8"]["epilogue"] = r.fp8_separate_epilogue ? "separate (bias_act_rows)" : "fused (cuBLASLt)";
    j["fp8"]["with_quant_ms"] = f + q;
    j["fp8"]["tflops_with_quant"] = tflops(r.flops, f + q);
    j["fp8"]["accumulate"] = "fast (the engine's default)";
    j["fp8_fp32_accumulate"] = times_json(r.fp8_acc32_ms, r.flops);
    j["quant"] = {
        {"ms", r.quant_ms}, {"median_ms", q}, {"bytes", quant_bytes(r)}, {"gbps", quant_bytes(r) / (q * 1e6)}};
    const double cp = median_of(r.copy_ms);
    j["copy_baseline"] = {{"what", "cudaMemcpyAsync of x (device to device), bytes read + written"},
                          {"ms", r.copy_ms},
                          {"median_ms", cp},
                          {"bytes", copy_bytes(r)},
                          {"gbps", copy_bytes(r) / (cp * 1e6)}};
    if (bf16) j["speedup_fp8_with_quant_over_bf16"] = median_of(r.bf16_ms) / (f + q);
  } else {
    j["fp8"] = nullptr;
  }
  j["accuracy"] = {{"reference", "cuBLAS fp32 GEMM (no TF32) of the unquantised bf16 inputs, fp32 bias, host GELU"},
                   {"rows", r.acc.rows},
                   {"row_step", r.acc.step},
                   {"rel_l2_fp8", fp8 ? nlohmann::json(r.acc.fp8) : nlohmann::json(nullptr)},
                   {"rel_l2_fp8_fp32_accumulate", fp8 ? nlohmann::json(r.acc.fp8_acc32) : nlohmann::json(nullptr)},
                   {"rel_l2_fp8_fast_vs_fp32_accumulate",
                    fp8 ? nlohmann::json(r.acc.fast_vs_acc32) : nlohmann::json(nullptr)},
                   {"rel_l2_bf16", bf16 ? nlohmann::json(r.acc.bf16) : nlohmann::json(nullptr)},
                   {"nonfinite_fp8", r.acc.nonfinite_fp8},
                   {"nonfinite_fp8_fp32_accumulate", r.acc.nonfinite_fp8_acc32},
                   {"nonfinite_bf16", r.acc.nonfinite_bf16}};
  return j;
}

struct GemmDevice {
  int dev = 0;
  BenchDevice bd;
  cudaDeviceProp prop{};
  bool fp8_ok = false;
  std::string note;  // why fp8 is not timed, when asked for by `both`
};

GemmDevice open_device(const GemmSettings& s) {
  GemmDevice d;
  d.dev = select_bench_device(s.device, "wan bench-gemm: no CUDA device is visible (it times GPU GEMMs)");
  d.bd = bench_device(d.dev);
  CUDA_CHECK(cudaGetDeviceProperties(&d.prop, d.dev));
  d.fp8_ok = fp8_supported(d.dev);
  const std::string why = cat("device ", d.dev, " (", d.bd.name, ", sm_", d.prop.major, d.prop.minor,
                              ") has no FP8 GEMM with outer-vector scales (needs sm_90 and cuBLASLt 12.9+)");
  WAN_CHECK(d.fp8_ok || s.gemm != "fp8", "wan bench-gemm: --gemm fp8: ", why);
  if (!d.fp8_ok && s.fp8) d.note = why + ": timing bf16 only";
  return d;
}

nlohmann::json result_json(const GemmSettings& s, const GemmDevice& d, const nlohmann::json& cases) {
  nlohmann::json J;
  put_tool_header(J, "wan bench-gemm");
  J["device"] = bench_device_json(d.bd);
  J["device"]["sm"] = cat(d.prop.major, d.prop.minor);
  J["device"]["cublaslt"] = d.bd.cublaslt_version;
  J["fp8_supported"] = d.fp8_ok;
  J["gemm"] = s.gemm;
  J["m"] = s.m;
  J["warmup"] = s.warmup;
  J["reps"] = s.reps;
  J["notes"] = d.note.empty() ? nlohmann::json::array() : nlohmann::json::array({d.note});
  J["method"] =
      "GemmRunner (cuBLASLt) on one stream; x [M, K] bf16 ~ N(0, 1), w [N, K] ~ N(0, 0.02^2), bias ~ N(0, 0.1^2) "
      "drawn on the GPU; fp8: e4m3 with per-token scales for x (quantised every call, timed apart) and "
      "per-channel scales for w (quantised once, untimed), cuBLASLt outer-vector scaling, fast accumulation (the "
      "engine's; fp8_fp32_accumulate: the same GEMM with fp32 promotion of the partial sums, timed too); "
      "CUDA events around each call, reps interleaved bf16 / quantise / fp8 / fp8 fp32-accumulate after warm-up, "
      "median; TFLOP/s = "
      "2*M*N*K / time; accuracy: rel L2 on every row_step-th row vs cuBLAS fp32 (no TF32) of the unquantised "
      "inputs";
  J["cases"] = cases;
  return J;
}
#endif  // WAN_HAVE_CUDA

}  // namespace

const api::CommandSpec& bench_gemm_spec() {
  static const api::CommandSpec s = [] {
    using api::Kind;
    api::CommandSpec c;
    c.name = "bench-gemm";
    c.summary = "time the DiT's GEMMs in bf16 and FP8 (TFLOP/s, quantisation GB/s, rel L2 vs fp32)";
    c.usage = {"bench-gemm [options]"};
    c.about =
        "Times GemmRunner's bf16 GEMM and its FP8 GEMM (e4m3, per-token and per-channel scales through "
        "cuBLASLt's outer-vector scaling, plus the activation quantisation) at the DiT's Linear shapes: "
        "dim 5120, FFN 13824, 512 text tokens.";
    api::Option gemm = api::option("gemm", Kind::Enum, "bf16|fp8|both", "both",
                                   "which GEMMs to time (fp8 is refused on a GPU without FP8 GEMMs)");
    gemm.choices = {"bf16", "fp8", "both"};
    c.options = {
        gemm,
        bench_int_option("m", "75600", 1, 1000000,
                         "token rows of the self-attention and FFN GEMMs (75600: 1280x720, 81 frames)"),
        bench_int_option("reps", "10", 1, 1000, "timed calls of each GEMM, interleaved (median)"),
        bench_int_option("warmup", "2", 0, 100, "untimed calls of each GEMM first"),
        bench_device_option(),
        bench_json_option(),
    };
    std::string names;
    for (const GemmCase& g : all_cases())
      names += cat("  ", g.name, ": ", g.token_rows ? "M = --m" : "M = 512", ", ", g.K, " -> ", g.N, " (", g.what,
                   ")\n");
    c.epilog = "Cases (all with a bf16 bias):\n" + names +
               "rel L2: against cuBLAS's fp32 GEMM of the unquantised inputs on about 1000 sampled rows.\n";
    return c;
  }();
  return s;
}

int cmd_bench_gemm(int argc, char** argv) {
  const api::Values args = api::parse_argv(bench_gemm_spec(), argc, argv);
  if (api::print_help_if_asked(args, bench_gemm_spec())) return 0;
  const GemmSettings s = parse_settings(args);
#ifndef WAN_HAVE_CUDA
  (void)s;
  WAN_THROW("wan bench-gemm: this wan was built without CUDA; rebuild with a CUDA toolkit (WAN_ENABLE_CUDA=ON)");
#else
  const GemmDevice d = open_device(s);
  const bool fp8 = s.fp8 && d.fp8_ok;
  printf("wan bench-gemm: --gemm %s, M = %lld (text: %lld), %lld warm-up + %lld timed calls, CUDA events, median\n",
         s.gemm.c_str(), s.m, (long long)kTextTokens, s.warmup, s.reps);
  printf("device %d: %s (sm_%d%d), %d SMs; cuBLASLt %d, FP8 GEMM %s\n", d.dev, d.bd.name.c_str(), d.prop.major,
         d.prop.minor, d.bd.sm_count, d.bd.cublaslt_version, d.fp8_ok ? "supported" : "unsupported");
  if (!d.note.empty()) printf("NOTE: %s\n", d.note.c_str());
  DevMem<uint8_t> ws(GemmRunner::kWorkspaceBytes);
  GemmRunner runner(ws.p, ws.n);
  Stream st;
  print_header();
  nlohmann::json jcases = nlohmann::json::array();
  std::string bad;
  for (size_t ci = 0; ci < all_cases().size(); ++ci) {
    const GemmCase& c = all_cases()[ci];
    const CaseRun r = run_case(c, ci, s, fp8, runner, st.s);
    print_case(c, r, s.bf16, fp8);
    jcases.push_back(case_json(c, r, s.bf16, fp8));
    if (r.bad()) bad += (bad.empty() ? "" : ", ") + std::string(c.name);
  }
  if (!s.json_path.empty()) write_json_file(s.json_path, result_json(s, d, jcases));
  WAN_ASSERT(bad.empty(), "bench-gemm: non-finite outputs in ", bad);
  return 0;
#endif
}

}  // namespace wan::cli
