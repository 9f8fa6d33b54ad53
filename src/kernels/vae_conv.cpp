// cuDNN convolution plans for the VAE encoder and decoder (see vae_conv.h). Uses cuDNN's convolution API
// (cudnnConvolutionForward and friends, marked deprecated in cuDNN 9 in favour of the graph API but
// still shipped and backed by the same engines): a plain forward convolution needs no graph, and the
// API's Find call times every algorithm on real buffers.
#include "kernels/vae_conv.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "core/error.h"
#include "kernels/check.h"

#if defined(WAN_HAVE_CUDNN)
#include <cudnn.h>
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif

namespace wan::cuda::vae_detail {

std::string ConvShape::str() const {
  std::ostringstream o;
  if (is3d)
    o << "3d D" << d << " " << h << "x" << w << " C" << c << "->K" << k << " k" << kt << "x" << kh << "x" << kw;
  else
    o << "2d N" << n << " " << h << "x" << w << " C" << c << "->K" << k << " k" << kh << "x" << kw;
  if (st != 1 || ss != 1) o << " s" << (is3d ? std::to_string(st) + "x" : std::string()) << ss << "x" << ss;
  return o.str();
}

#if defined(WAN_HAVE_CUDNN)

namespace {

const char* algo_name(cudnnConvolutionFwdAlgo_t a) {
  switch (a) {
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM: return "IMPLICIT_GEMM";
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM: return "IMPLICIT_PRECOMP_GEMM";
    case CUDNN_CONVOLUTION_FWD_ALGO_GEMM: return "GEMM";
    case CUDNN_CONVOLUTION_FWD_ALGO_DIRECT: return "DIRECT";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT: return "FFT";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING: return "FFT_TILING";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD: return "WINOGRAD";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED: return "WINOGRAD_NONFUSED";
    default: return "?";
  }
}

struct Plan {
  ConvShape shape;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t f = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  cudnnMathType_t math = CUDNN_TENSOR_OP_MATH;
  size_t workspace = 0;
  bool chosen = false;  // an algorithm is fixed (heuristic mode: by choose(); find mode: after find)
  std::string found;    // find mode: the timing table
};

}  // namespace

struct ConvRunner::Impl {
  bool find_mode = false;
  size_t limit = 0;
  cudnnHandle_t handle = nullptr;
  std::vector<Plan> plans;  // few shapes (tens): linear search

  Plan* lookup(const ConvShape& s) {
    for (Plan& p : plans)
      if (p.shape == s) return &p;
    return nullptr;
  }
  Plan& get(const ConvShape& s) {
    Plan* p = lookup(s);
    WAN_ASSERT(p, "vae conv: shape ", s.str(), " was not prepared");
    return *p;
  }

  Plan& make(const ConvShape& s) {
    WAN_CHECK(s.c % 8 == 0 && s.k % 8 == 0, "vae conv ", s.str(), ": channels must be multiples of 8");
    WAN_CHECK(s.st >= 1 && s.ss >= 1 && (s.is3d || s.st == 1), "vae conv ", s.str(), ": bad strides");
    WAN_CHECK(s.out_frames() > 0 && s.out_h() > 0 && s.out_w() > 0, "vae conv ", s.str(), ": empty output");
    const int64_t in_elems = (s.is3d ? s.d : s.n) * s.h * s.w * s.c;
    const int64_t out_elems = s.out_frames() * s.out_h() * s.out_w() * s.k;
    WAN_CHECK(std::max(in_elems, out_elems) < (int64_t{1} << 31), "vae conv ", s.str(),
              ": tensor too large for cuDNN's 32-bit descriptors");
    Plan p;
    p.shape = s;
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&p.x));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&p.y));
    CUDNN_CHECK(cudnnCreateFilterDescriptor(&p.f));
    CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&p.conv));
    if (s.is3d) {
      const int xd[5] = {1, int(s.c), int(s.d), int(s.h), int(s.w)};
      const int fd[5] = {int(s.k), int(s.c), s.kt, s.kh, s.kw};
      const int pad[3] = {0, s.ph, s.pw}, stride[3] = {s.st, s.ss, s.ss}, one[3] = {1, 1, 1};
      CUDNN_CHECK(cudnnSetTensorNdDescriptorEx(p.x, CUDNN_TENSOR_NHWC, CUDNN_DATA_BFLOAT16, 5, xd));
      CUDNN_CHECK(cudnnSetFilterNdDescriptor(p.f, CUDNN_DATA_BFLOAT16, CUDNN_TENSOR_NHWC, 5, fd));
      CUDNN_CHECK(
          cudnnSetConvolutionNdDescriptor(p.conv, 3, pad, stride, one, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
      int yd[5];
      CUDNN_CHECK(cudnnGetConvolutionNdForwardOutputDim(p.conv, p.x, p.f, 5, yd));
      WAN_ASSERT(yd[0] == 1 && yd[1] == s.k && yd[2] == s.out_frames() && yd[3] == s.out_h() && yd[4] == s.out_w(),
                 "vae conv ", s.str(), ": unexpected output dims");
      CUDNN_CHECK(cudnnSetTensorNdDescriptorEx(p.y, CUDNN_TENSOR_NHWC, CUDNN_DATA_BFLOAT16, 5, yd));
    } else {
      WAN_ASSERT(s.kt == 1, "2-D conv with a temporal kernel");
      const int xd[4] = {int(s.n), int(s.c), int(s.h), int(s.w)};
      const int fd[4] = {int(s.k), int(s.c), s.kh, s.kw};
      const int pad[2] = {s.ph, s.pw}, stride[2] = {s.ss, s.ss}, one[2] = {1, 1};
      CUDNN_CHECK(cudnnSetTensorNdDescriptorEx(p.x, CUDNN_TENSOR_NHWC, CUDNN_DATA_BFLOAT16, 4, xd));
      CUDNN_CHECK(cudnnSetFilterNdDescriptor(p.f, CUDNN_DATA_BFLOAT16, CUDNN_TENSOR_NHWC, 4, fd));
      CUDNN_CHECK(
          cudnnSetConvolutionNdDescriptor(p.conv, 2, pad, stride, one, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
      int yd[4];
      CUDNN_CHECK(cudnnGetConvolutionNdForwardOutputDim(p.conv, p.x, p.f, 4, yd));
      WAN_ASSERT(yd[0] == s.n && yd[1] == s.k && yd[2] == s.out_h() && yd[3] == s.out_w(), "vae conv ", s.str(),
                 ": unexpected output dims");
      CUDNN_CHECK(cudnnSetTensorNdDescriptorEx(p.y, CUDNN_TENSOR_NHWC, CUDNN_DATA_BFLOAT16, 4, yd));
    }
    CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, CUDNN_TENSOR_OP_MATH));
    plans.push_back(p);  // heuristic mode: chosen by choose(), all shapes at once
    return plans.back();
  }

  void choose_heuristic(cudnnHandle_t h, Plan& p) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int n = 0;
    CUDNN_CHECK(
        cudnnGetConvolutionForwardAlgorithm_v7(h, p.x, p.f, p.conv, p.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf));
    for (int i = 0; i < n; ++i) {
      if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].determinism != CUDNN_DETERMINISTIC) continue;
      if (perf[i].memory > limit) continue;
      set_algo(h, p, perf[i].algo, perf[i].mathType);
      return;
    }
    WAN_THROW("vae conv ", p.shape.str(), ": cuDNN offers no deterministic algorithm within ", limit >> 20,
              " MiB of workspace");
  }

  void set_algo(cudnnHandle_t h, Plan& p, cudnnConvolutionFwdAlgo_t algo, cudnnMathType_t math) {
    CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, math));
    size_t ws = 0;
    CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, p.x, p.f, p.conv, p.y, algo, &ws));
    p.algo = algo;
    p.math = math;
    p.workspace = ws;
    p.chosen = true;
  }
  void set_algo(Plan& p, cudnnConvolutionFwdAlgo_t algo, cudnnMathType_t math) { set_algo(handle, p, algo, math); }
};

namespace {

// The heuristic's choice per (device, shape, workspace limit), kept for the process: a run plans the
// same decoder twice (its memory plan, then the decoder itself), and each query costs milliseconds.
struct Choice {
  cudnnConvolutionFwdAlgo_t algo;
  cudnnMathType_t math;
};
std::mutex g_choices_mu;
std::map<std::string, Choice> g_choices;

std::string choice_key(int device, const ConvShape& s, size_t limit) {
  std::ostringstream o;
  o << device << ':' << s.is3d << ':' << s.n << ',' << s.d << ',' << s.h << ',' << s.w << ',' << s.c << ',' << s.k
    << ',' << s.kt << ',' << s.kh << ',' << s.kw << ',' << s.ph << ',' << s.pw << ',' << s.st << ',' << s.ss << ':'
    << limit;
  return o.str();
}

}  // namespace

void ConvRunner::choose() {
  Impl& m = *impl_;
  if (m.find_mode) return;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  std::vector<Plan*> todo;
  {
    std::lock_guard<std::mutex> lock(g_choices_mu);
    for (Plan& p : m.plans) {
      if (p.chosen) continue;
      auto it = g_choices.find(choice_key(device, p.shape, m.limit));
      if (it != g_choices.end())
        m.set_algo(p, it->second.algo, it->second.math);
      else
        todo.push_back(&p);
    }
  }
  // The heuristic queries are host work of a few milliseconds each, tens of shapes per coder: spread
  // over threads with a cuDNN handle each (handles are per thread; the plans are disjoint).
  const size_t threads = std::min<size_t>(todo.size(), 8);
  std::vector<std::exception_ptr> errors(threads);
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      cudnnHandle_t h = nullptr;
      try {
        CUDA_CHECK(cudaSetDevice(device));
        CUDNN_CHECK(cudnnCreate(&h));
        for (size_t i = t; i < todo.size(); i += threads) m.choose_heuristic(h, *todo[i]);
      } catch (...) {
        errors[t] = std::current_exception();
      }
      if (h) cudnnDestroy(h);
    });
  for (std::thread& th : pool) th.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  std::lock_guard<std::mutex> lock(g_choices_mu);
  for (const Plan* p : todo) g_choices[choice_key(device, p->shape, m.limit)] = Choice{p->algo, p->math};
}

ConvRunner::ConvRunner(bool find, size_t workspace_limit) : impl_(std::make_unique<Impl>()) {
  impl_->find_mode = find;
  impl_->limit = workspace_limit;
  CUDNN_CHECK(cudnnCreate(&impl_->handle));
}

ConvRunner::~ConvRunner() {
  for (Plan& p : impl_->plans) {
    cudnnDestroyTensorDescriptor(p.x);
    cudnnDestroyTensorDescriptor(p.y);
    cudnnDestroyFilterDescriptor(p.f);
    cudnnDestroyConvolutionDescriptor(p.conv);
  }
  if (impl_->handle) cudnnDestroy(impl_->handle);
}

size_t ConvRunner::prepare(const ConvShape& s) {
  Plan* p = impl_->lookup(s);
  if (!p) p = &impl_->make(s);
  return p->chosen ? p->workspace : impl_->limit;
}

void ConvRunner::find(const ConvShape& s, const void* x, const void* w, void* y, void* ws, size_t ws_bytes) {
  Plan& p = impl_->get(s);
  if (p.chosen) return;
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int n = 0;
  CUDNN_CHECK(cudnnSetStream(impl_->handle, nullptr));
  CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(impl_->handle, p.x, x, p.f, w, p.conv, p.y, y,
                                                     CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf, ws, ws_bytes));
  std::ostringstream o;
  o << s.str() << " (" << s.flops() * 1e-9 << " GFLOP):";
  int best = -1;
  for (int i = 0; i < n; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    char line[160];
    std::snprintf(line, sizeof line, "\n    %-22s %8.3f ms %7.1f TFLOP/s ws %6.1f MiB%s%s", algo_name(perf[i].algo),
                  perf[i].time, s.flops() / (perf[i].time * 1e-3) * 1e-12, perf[i].memory / 1048576.0,
                  perf[i].determinism == CUDNN_DETERMINISTIC ? "" : " (non-deterministic)",
                  perf[i].mathType == CUDNN_TENSOR_OP_MATH ? "" : " (no tensor ops)");
    o << line;
    if (best < 0 && perf[i].determinism == CUDNN_DETERMINISTIC && perf[i].memory <= ws_bytes) best = i;
  }
  WAN_CHECK(best >= 0, "vae conv ", s.str(), ": cuDNN found no usable deterministic algorithm");
  impl_->set_algo(p, perf[best].algo, perf[best].mathType);
  WAN_CHECK(p.workspace <= ws_bytes, "vae conv ", s.str(), ": chosen algorithm needs more workspace than given");
  p.found = o.str();
}

void ConvRunner::run(const ConvShape& s, const void* x, const void* w, void* y, void* ws, size_t ws_bytes,
                     cudaStream_t stream) {
  Plan& p = impl_->get(s);
  WAN_ASSERT(p.chosen, "vae conv ", s.str(), ": no algorithm chosen (find mode needs find() first)");
  WAN_ASSERT(p.workspace <= ws_bytes, "vae conv ", s.str(), ": workspace ", ws_bytes, " < ", p.workspace);
  const float alpha = 1.0f, beta = 0.0f;
  CUDNN_CHECK(cudnnSetStream(impl_->handle, stream));
  CUDNN_CHECK(cudnnConvolutionForward(impl_->handle, &alpha, p.x, x, p.f, w, p.conv, p.algo, ws, p.workspace, &beta,
                                      p.y, y));
}

std::string ConvRunner::plans_str() const {
  std::ostringstream o;
  o << "  (cuDNN " << cudnnGetVersion() << ")\n";
  for (const Plan& p : impl_->plans) {
    char line[200];
    std::snprintf(line, sizeof line, "  %-46s %-22s ws %7.1f MiB\n", p.shape.str().c_str(),
                  p.chosen ? algo_name(p.algo) : "(not chosen)", p.workspace / 1048576.0);
    o << line;
  }
  return o.str();
}

std::string ConvRunner::find_report() const {
  std::ostringstream o;
  for (const Plan& p : impl_->plans)
    if (!p.found.empty()) o << "  " << p.found << "\n";
  return o.str();
}

size_t ConvRunner::max_workspace() const {
  size_t m = 0;
  for (const Plan& p : impl_->plans) m = std::max(m, p.chosen ? p.workspace : impl_->limit);
  return m;
}

#else  // no cuDNN

struct ConvRunner::Impl {};
ConvRunner::ConvRunner(bool, size_t) { WAN_THROW("the GPU VAE needs cuDNN (not found at build time)"); }
ConvRunner::~ConvRunner() = default;
size_t ConvRunner::prepare(const ConvShape&) { return 0; }
void ConvRunner::find(const ConvShape&, const void*, const void*, void*, void*, size_t) {}
void ConvRunner::run(const ConvShape&, const void*, const void*, void*, void*, size_t, cudaStream_t) {}
std::string ConvRunner::plans_str() const { return {}; }
std::string ConvRunner::find_report() const { return {}; }
size_t ConvRunner::max_workspace() const { return 0; }
void ConvRunner::choose() {}

#endif

}  // namespace wan::cuda::vae_detail
