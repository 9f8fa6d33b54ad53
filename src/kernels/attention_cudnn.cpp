// Fused flash attention through cuDNN's backend graph API (see attention_cudnn.h for the contract).
//
// The graph is the pattern cuDNN fuses into one flash-attention engine (the same node sequence cuDNN's
// public frontend emits for SDPA forward):
//   S  = Q·Kᵀ                          matmul, fp32 [B,H,Lq,Lk] (virtual; never materialised)
//   S1 = S·scale                       pointwise MUL with a by-value scalar
//   S2 = select(S1, -inf, row<q_len ∧ col<k_len)    padding mask (only when masked)
//   M = max_j S2;  E = exp(S2 − M);  Z = Σ_j E;  LSE = M + log Z;  P = bf16(E / Z)
//   O  = P·V                           matmul, fp32 accumulation, bf16 output
// cuDNN takes Kᵀ as a [B,H,D,Lk] view of K: swapping the last two dims and strides of K's descriptor
// gives it without a copy. The padding mask needs a q_len tensor too; each plan owns a device [B]
// array filled with Lq (allocated once, at plan build).
#include "kernels/attention_cudnn.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/check.h"
#include "kernels/rng.h"

#if defined(WAN_HAVE_CUDNN)
#include "kernels/cudnn_graph.h"
#endif

namespace wan::cuda {

namespace {
[[maybe_unused]] void validate(const AttentionShape& s) {
  WAN_CHECK(s.D == 128, "attention_cudnn: head dim ", s.D, " unsupported (only 128)");
  // Measured on the H100 device (cuDNN library 9.14 at run time): a graph with an FP32 O tensor
  // finalizes into a plan, but the fused engine writes bf16 into it (half the f32 buffer stays
  // unwritten). Refuse it here.
  WAN_CHECK(s.out == AttnOutType::BF16,
            "attention_cudnn: fp32 output is not supported (cuDNN's fused attention writes bf16 output; "
            "use AttnOutType::BF16)");
  WAN_CHECK(s.B >= 1 && s.Lq >= 1 && s.Lk >= 1 && s.H >= 1, "attention_cudnn: bad shape B=", s.B, " Lq=", s.Lq,
            " Lk=", s.Lk, " H=", s.H);
  for (int64_t ld : {s.q_ld, s.k_ld, s.v_ld, s.o_ld})
    WAN_CHECK(ld == 0 || (ld >= s.H * s.D && ld % 8 == 0), "attention_cudnn: token stride ", ld,
              " must be >= H*D = ", s.H * s.D, " and a multiple of 8");
}
[[maybe_unused]] int64_t ld_or_dense(int64_t ld, const AttentionShape& s) { return ld ? ld : s.H * s.D; }
}  // namespace

#if defined(WAN_HAVE_CUDNN)
namespace cg = cudnn_graph;

// Named (not anonymous) so that CudnnAttention::Impl may hold Entry without linkage warnings.
namespace attn_detail {
// Tensor uids of the non-virtual tensors (the variant pack names them); virtual ones start at 100.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kSeqQ, kSeqKV, kNegInf, kFirstVirtual = 100 };

struct Entry {
  AttentionShape shape;
  cg::Arena arena;
  cg::Desc graph;
  cg::Plan plan;
  int32_t* q_lens = nullptr;  // device [B], all Lq (padding-mask row bound)
  Entry() = default;
  Entry(const Entry&) = delete;
  Entry& operator=(const Entry&) = delete;
  ~Entry() {
    if (q_lens) cudaFree(q_lens);  // no throw from a destructor
  }
};

// Creates and finalizes every tensor and operation descriptor of the graph (needs no handle).
std::vector<const cg::Desc*> build_ops(Entry& e) {
  const AttentionShape& s = e.shape;
  const int64_t B = s.B, H = s.H, Lq = s.Lq, Lk = s.Lk, D = s.D;
  const int64_t qld = ld_or_dense(s.q_ld, s), kld = ld_or_dense(s.k_ld, s), vld = ld_or_dense(s.v_ld, s),
                old = ld_or_dense(s.o_ld, s);
  const cudnnDataType_t bf16 = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT, i32 = CUDNN_DATA_INT32,
                        boolean = CUDNN_DATA_BOOLEAN;
  cg::Arena& A = e.arena;
  int64_t next_uid = kFirstVirtual;
  const cg::Dims score_dims{B, H, Lq, Lk}, score_strides{H * Lq * Lk, Lq * Lk, Lk, 1};
  const cg::Dims row_dims{B, H, Lq, 1}, row_strides{H * Lq, Lq, 1, 1};
  const cg::Dims one{1, 1, 1, 1};
  auto score = [&](cudnnDataType_t t) -> cg::Desc& { return A.tensor(next_uid++, t, score_dims, score_strides, true); };
  auto rowvec = [&]() -> cg::Desc& { return A.tensor(next_uid++, f32, row_dims, row_strides, true); };

  // Q [B,H,Lq,D] and Kᵀ [B,H,D,Lk] / V [B,H,Lk,D] as strided views of the token-major buffers.
  cg::Desc& q = A.tensor(kQ, bf16, {B, H, Lq, D}, {Lq * qld, D, qld, 1}, false);
  cg::Desc& kt = A.tensor(kK, bf16, {B, H, D, Lk}, {Lk * kld, D, 1, kld}, false);
  cg::Desc& v = A.tensor(kV, bf16, {B, H, Lk, D}, {Lk * vld, D, vld, 1}, false);
  cg::Desc& o = A.tensor(kO, s.out == AttnOutType::F32 ? f32 : bf16, {B, H, Lq, D}, {Lq * old, D, old, 1}, false);
  cg::Desc& scale = A.tensor(kScale, f32, one, one, false, true);
  cg::Desc* seq_q = nullptr;
  cg::Desc* seq_kv = nullptr;
  if (s.masked) {
    seq_q = &A.tensor(kSeqQ, i32, {B, 1, 1, 1}, one, false);
    seq_kv = &A.tensor(kSeqKV, i32, {B, 1, 1, 1}, one, false);
  }

  std::vector<const cg::Desc*> ops;
  cg::Desc& s0 = score(f32);
  ops.push_back(&A.matmul(q, kt, s0, seq_q, seq_kv, nullptr, s.masked, 0.0));
  cg::Desc& s1 = score(f32);
  ops.push_back(&A.pointwise(CUDNN_POINTWISE_MUL, f32, s0, &scale, nullptr, s1));
  cg::Desc* logits = &s1;
  if (s.masked) {
    cg::Desc& neg_inf = A.tensor(kNegInf, f32, one, one, false, true);
    cg::Desc& row = score(i32);
    ops.push_back(&A.pointwise(CUDNN_POINTWISE_GEN_INDEX, i32, s1, nullptr, nullptr, row, 2));
    cg::Desc& col = score(i32);
    ops.push_back(&A.pointwise(CUDNN_POINTWISE_GEN_INDEX, i32, s1, nullptr, nullptr, col, 3));
    cg::Desc& row_ok = score(boolean);
    ops.push_back(&A.pointwise(CUDNN_POINTWISE_CMP_LT, boolean, row, seq_q, nullptr, row_ok));
    cg::Desc& col_ok = score(boolean);
    ops.push_back(&A.pointwise(CUDNN_POINTWISE_CMP_LT, boolean, col, seq_kv, nullptr, col_ok));
    cg::Desc& keep = score(boolean);
    ops.push_back(&A.pointwise(CUDNN_POINTWISE_LOGICAL_AND, boolean, row_ok, &col_ok, nullptr, keep));
    cg::Desc& s2 = score(f32);
    // BINARY_SELECT: y = t ? x : b
    ops.push_back(&A.pointwise(CUDNN_POINTWISE_BINARY_SELECT, f32, s1, &neg_inf, &keep, s2));
    logits = &s2;
  }
  // softmax with its statistics, as max / sub / exp / sum / log / add / div nodes
  cg::Desc& mx = rowvec();
  ops.push_back(&A.reduction(CUDNN_REDUCE_TENSOR_MAX, *logits, mx));
  cg::Desc& centered = score(f32);
  ops.push_back(&A.pointwise(CUDNN_POINTWISE_SUB, f32, *logits, &mx, nullptr, centered));
  cg::Desc& ex = score(f32);
  ops.push_back(&A.pointwise(CUDNN_POINTWISE_EXP, f32, centered, nullptr, nullptr, ex));
  cg::Desc& sum = rowvec();
  ops.push_back(&A.reduction(CUDNN_REDUCE_TENSOR_ADD, ex, sum));
  cg::Desc& lg = rowvec();
  ops.push_back(&A.pointwise(CUDNN_POINTWISE_LOG, f32, sum, nullptr, nullptr, lg));
  cg::Desc& stats = s.lse ? A.tensor(kStats, f32, row_dims, row_strides, false) : rowvec();
  ops.push_back(&A.pointwise(CUDNN_POINTWISE_ADD, f32, mx, &lg, nullptr, stats));
  cg::Desc& p = score(bf16);  // the PV matmul takes its A operand in the I/O type
  ops.push_back(&A.pointwise(CUDNN_POINTWISE_DIV, f32, ex, &sum, nullptr, p));
  ops.push_back(&A.matmul(p, v, o, seq_q, nullptr, seq_kv, false, 0.0));
  return ops;
}

void build_graph(Entry& e, cudnnHandle_t handle) {
  const std::vector<const cg::Desc*> ops = build_ops(e);
  e.graph = cg::operation_graph(handle, ops);
  e.plan = cg::build_plan(handle, e.graph);
}
}  // namespace attn_detail
using namespace attn_detail;

struct CudnnAttention::Impl {
  cudnnHandle_t handle = nullptr;
  std::vector<std::unique_ptr<Entry>> cache;
  size_t built = 0;

  Entry& get(const AttentionShape& s) {
    for (auto& e : cache)
      if (e->shape == s) return *e;
    validate(s);
    auto e = std::make_unique<Entry>();
    e->shape = s;
    try {
      build_graph(*e, handle);
    } catch (const Error& err) {
      throw err.with_context(cat("attention_cudnn: plan for B=", s.B, " Lq=", s.Lq, " Lk=", s.Lk, " H=", s.H,
                                 s.masked ? " masked" : "", s.lse ? " lse" : "",
                                 s.out == AttnOutType::F32 ? " f32-out" : " bf16-out"));
    }
    if (s.masked) {
      std::vector<int32_t> lq(static_cast<size_t>(s.B), static_cast<int32_t>(s.Lq));
      CUDA_CHECK(cudaMalloc(&e->q_lens, lq.size() * sizeof(int32_t)));
      CUDA_CHECK(cudaMemcpy(e->q_lens, lq.data(), lq.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    }
    ++built;
    cache.push_back(std::move(e));
    return *cache.back();
  }
};

CudnnAttention::CudnnAttention() : impl_(std::make_unique<Impl>()) {
  cg::check(cudnnCreate(&impl_->handle), "create handle");
}

CudnnAttention::~CudnnAttention() {
  if (!impl_) return;
  impl_->cache.clear();  // plans before the handle they were built on
  if (impl_->handle) cudnnDestroy(impl_->handle);
}

size_t CudnnAttention::workspace_size(const AttentionShape& s) {
  return static_cast<size_t>(impl_->get(s).plan.workspace);
}

size_t CudnnAttention::plans_built() const { return impl_->built; }

std::string CudnnAttention::describe(const AttentionShape& s) {
  Entry& e = impl_->get(s);
  return cat("cuDNN ", cudnnGetVersion(), " fused attention, engine ", e.plan.engine_index, ", workspace ",
             e.plan.workspace, " B");
}

void CudnnAttention::run(const AttentionShape& s, const AttentionArgs& a, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream) {
  Entry& e = impl_->get(s);
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  WAN_CHECK(a.q && a.k && a.v && a.o, "attention_cudnn: null q/k/v/o");
  WAN_CHECK(aligned(a.q) && aligned(a.k) && aligned(a.v) && aligned(a.o),
            "attention_cudnn: q/k/v/o must be 16-byte aligned");
  WAN_CHECK(!s.masked || a.k_lens, "attention_cudnn: masked shape needs k_lens");
  WAN_CHECK(!s.lse || a.lse, "attention_cudnn: lse shape needs an lse buffer");
  WAN_CHECK(workspace_bytes >= static_cast<size_t>(e.plan.workspace), "attention_cudnn: workspace ", workspace_bytes,
            " B < ", e.plan.workspace, " B needed");
  WAN_CHECK(e.plan.workspace == 0 || workspace, "attention_cudnn: null workspace");
  float scale = a.scale != 0.0f ? a.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.D)));
  float neg_inf = -INFINITY;
  std::vector<int64_t> uids{kQ, kK, kV, kO, kScale};
  std::vector<void*> ptrs{const_cast<void*>(a.q), const_cast<void*>(a.k), const_cast<void*>(a.v), a.o, &scale};
  if (s.masked) {
    uids.insert(uids.end(), {kSeqQ, kSeqKV, kNegInf});
    ptrs.insert(ptrs.end(), {e.q_lens, const_cast<int32_t*>(a.k_lens), &neg_inf});
  }
  if (s.lse) {
    uids.push_back(kStats);
    ptrs.push_back(a.lse);
  }
  cg::check(cudnnSetStream(impl_->handle, stream), "set stream");
  cg::execute(impl_->handle, e.plan, uids, ptrs, workspace);
}

bool cudnn_available() { return device_count() > 0; }

#else  // !WAN_HAVE_CUDNN

struct CudnnAttention::Impl {};
CudnnAttention::CudnnAttention() { WAN_THROW("attention_cudnn: this build has no cuDNN"); }
CudnnAttention::~CudnnAttention() = default;
size_t CudnnAttention::workspace_size(const AttentionShape&) { WAN_THROW("attention_cudnn: this build has no cuDNN"); }
void CudnnAttention::run(const AttentionShape&, const AttentionArgs&, void*, size_t, cudaStream_t) {
  WAN_THROW("attention_cudnn: this build has no cuDNN");
}
size_t CudnnAttention::plans_built() const { return 0; }
std::string CudnnAttention::describe(const AttentionShape&) { return "no cuDNN"; }
bool cudnn_available() { return false; }

#endif

}  // namespace wan::cuda
