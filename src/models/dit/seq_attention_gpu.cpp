// Sequence-parallel self-attention (see seq_attention_gpu.h): Ulysses all-to-alls on the main stream,
// ring exchanges on a side stream overlapped with the block attentions, fp32 LSE merges.
#include "models/dit/seq_attention_gpu.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/check.h"
#include "kernels/seq_parallel_kernels.h"

namespace wan::cuda {

std::vector<std::pair<std::string, size_t>> SeqParallelAttention::plan_buffers(const Geometry& g) {
  std::vector<std::pair<std::string, size_t>> v;
  if (g.U == 1 && g.R == 1) return v;
  const size_t rows = static_cast<size_t>(g.rows()), D = static_cast<size_t>(g.D()), b2 = 2, f4 = 4;
  const size_t H = static_cast<size_t>(g.heads);
  if (g.U > 1) {
    v.emplace_back("sp.send", 3 * rows * D * b2);
    v.emplace_back("sp.recv", 3 * rows * D * b2);
    v.emplace_back("sp.q", rows * D * b2);
  }
  v.emplace_back("sp.kv0", 2 * rows * D * b2);
  if (g.R > 1) v.emplace_back("sp.kv1", 2 * rows * D * b2);
  if (g.U > 1) v.emplace_back("sp.o", rows * D * b2);
  if (g.R > 1) {
    v.emplace_back("sp.o_part", rows * D * b2);
    v.emplace_back("sp.lse_part", rows * H * f4);
    v.emplace_back("sp.acc", rows * D * f4);
    v.emplace_back("sp.acc_lse", rows * H * f4);
  }
  v.emplace_back("sp.k_lens", static_cast<size_t>(g.R * k_lens_stride(g)) * 4);
  return v;
}

AttentionShape SeqParallelAttention::attention_shape(const Geometry& g) {
  AttentionShape s;
  s.B = g.B, s.Lq = g.block(), s.Lk = g.block(), s.H = g.heads_per_rank(), s.D = 128;
  s.masked = g.padded();
  s.lse = g.R > 1;
  return s;
}

int64_t SeqParallelAttention::step_keys(const Geometry& g, int ring_rank, int step) {
  const int blk = ((ring_rank - step) % g.R + g.R) % g.R;  // the block held at this step
  return std::clamp<int64_t>(g.L - blk * g.block(), 0, g.block());
}

SeqParallelAttention::SeqParallelAttention(SeqComm* ulysses, SeqComm* ring) : ulysses_(ulysses), ring_(ring) {
  const int R = ring ? ring->size() : 1;
  CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&ev_ready_, cudaEventDisableTiming));
  ev_attn_.assign(static_cast<size_t>(R), nullptr);
  ev_recv_.assign(static_cast<size_t>(R), nullptr);
  for (int i = 0; i < R; ++i) {
    CUDA_CHECK(cudaEventCreateWithFlags(&ev_attn_[i], cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&ev_recv_[i], cudaEventDisableTiming));
  }
}

SeqParallelAttention::~SeqParallelAttention() {
  if (side_) cudaStreamSynchronize(side_);
  for (cudaEvent_t e : ev_attn_)
    if (e) cudaEventDestroy(e);
  for (cudaEvent_t e : ev_recv_)
    if (e) cudaEventDestroy(e);
  if (ev_ready_) cudaEventDestroy(ev_ready_);
  if (side_) cudaStreamDestroy(side_);
}

void SeqParallelAttention::set_key_lengths(const Geometry& g, cudaStream_t stream) {
  const int ring_rank = ring_ ? ring_->rank() : 0;
  const int64_t stride = k_lens_stride(g);
  k_lens_host_.assign(static_cast<size_t>(g.R * stride), 0);
  for (int i = 0; i < g.R; ++i)
    for (int64_t b = 0; b < g.B; ++b)
      k_lens_host_[static_cast<size_t>(i * stride + b)] = static_cast<int32_t>(step_keys(g, ring_rank, i));
  // Pageable source: the copy is staged before cudaMemcpyAsync returns, so the vector may change after.
  CUDA_CHECK(cudaMemcpyAsync(buf_.k_lens, k_lens_host_.data(), k_lens_host_.size() * 4, cudaMemcpyHostToDevice,
                             stream));
}

void SeqParallelAttention::run(const Geometry& g, const __nv_bfloat16* q, const __nv_bfloat16* k,
                               const __nv_bfloat16* v, int64_t v_ld, __nv_bfloat16* out, const AttentionFn& attention,
                               cudaStream_t s) {
  const int U = g.U, R = g.R;
  WAN_CHECK((ulysses_ ? ulysses_->size() : 1) == U && (ring_ ? ring_->size() : 1) == R,
            "sequence-parallel attention: geometry U=", U, " R=", R, " does not match the groups");
  WAN_CHECK(g.heads % U == 0, "sequence-parallel attention: ", g.heads, " heads do not split over ", U, " ranks");
  const int64_t rows = g.rows(), D = g.D(), Du = D / U, blk_elems = rows * D;  // one block tensor: B·U·S·Du
  const size_t b2 = 2;
  const AttentionShape shape = attention_shape(g);

  // 1. This rank's ring block: q (queries), kv[0] = k | v, all [B, U·S, H/U, 128] dense.
  const __nv_bfloat16* qb = q;
  if (U > 1) {
    TokenMajor tm;
    tm.t[0] = reinterpret_cast<char*>(const_cast<__nv_bfloat16*>(q)), tm.ld_bytes[0] = D * 2;
    tm.t[1] = reinterpret_cast<char*>(const_cast<__nv_bfloat16*>(k)), tm.ld_bytes[1] = D * 2;
    tm.t[2] = reinterpret_cast<char*>(const_cast<__nv_bfloat16*>(v)), tm.ld_bytes[2] = v_ld * 2;
    token_major_chunks(tm, reinterpret_cast<char*>(buf_.send), 3, U, rows, Du * 2, true, s);
    ulysses_->all_to_all(buf_.send, buf_.recv, static_cast<size_t>(3 * rows * Du) * b2, s);
    SeqMajor sm;
    sm.s[0] = reinterpret_cast<char*>(buf_.q);
    sm.s[1] = reinterpret_cast<char*>(buf_.kv[0]);
    sm.s[2] = reinterpret_cast<char*>(buf_.kv[0] + blk_elems);
    seq_major_chunks(sm, reinterpret_cast<char*>(buf_.recv), 3, U, g.B, g.S, Du * 2, false, s);
    qb = buf_.q;
  } else {
    TokenMajor tm;  // U = 1 (ring only): pack k and the strided v into one contiguous block to pass around
    tm.t[0] = reinterpret_cast<char*>(const_cast<__nv_bfloat16*>(k)), tm.ld_bytes[0] = D * 2;
    tm.t[1] = reinterpret_cast<char*>(const_cast<__nv_bfloat16*>(v)), tm.ld_bytes[1] = v_ld * 2;
    token_major_chunks(tm, reinterpret_cast<char*>(buf_.kv[0]), 2, 1, rows, D * 2, true, s);
  }
  // The attention output in head layout: straight into `out` when no all-to-all follows.
  __nv_bfloat16* o_head = U > 1 ? buf_.o : out;

  // 2. Attention over the R blocks.
  auto attend = [&](const __nv_bfloat16* kv, int step, __nv_bfloat16* o, float* lse) {
    AttentionArgs a;
    a.q = qb, a.k = kv, a.v = kv + blk_elems, a.o = o, a.lse = lse;
    a.k_lens = shape.masked ? buf_.k_lens + step * k_lens_stride(g) : nullptr;
    attention(shape, a, s);
  };
  if (R == 1) {
    attend(buf_.kv[0], 0, o_head, nullptr);
  } else {
    const int ring_rank = ring_->rank();
    int first = -1, last = -1;
    for (int i = 0; i < R; ++i)
      if (step_keys(g, ring_rank, i) > 0) {
        if (first < 0) first = i;
        last = i;
      }
    WAN_ASSERT(first >= 0, "ring attention: every block of this rank is padding");
    const size_t kv_bytes = static_cast<size_t>(2 * blk_elems) * b2;
    CUDA_CHECK(cudaEventRecord(ev_ready_, s));
    CUDA_CHECK(cudaStreamWaitEvent(side_, ev_ready_, 0));
    int cur = 0;
    for (int i = 0; i < R; ++i) {
      if (i + 1 < R) {
        // kv[cur] goes to the next rank while it is used here; kv[1 - cur] (read by the previous step's
        // attention) receives the previous rank's block.
        if (i > 0) CUDA_CHECK(cudaStreamWaitEvent(side_, ev_attn_[i - 1], 0));
        ring_->ring_exchange(buf_.kv[cur], buf_.kv[1 - cur], kv_bytes, side_);
        CUDA_CHECK(cudaEventRecord(ev_recv_[i], side_));
      }
      if (step_keys(g, ring_rank, i) > 0) {
        if (first == last) {
          attend(buf_.kv[cur], i, o_head, nullptr);
        } else {
          attend(buf_.kv[cur], i, buf_.o_part, buf_.lse_part);
          ring_merge(buf_.o_part, buf_.lse_part, buf_.acc, buf_.acc_lse, i == last ? o_head : nullptr, g.B,
                     g.block(), g.heads_per_rank(), i == first, s);
        }
      }
      if (i + 1 < R) {
        CUDA_CHECK(cudaEventRecord(ev_attn_[i], s));
        CUDA_CHECK(cudaStreamWaitEvent(s, ev_recv_[i], 0));  // also joins the side stream after the last one
        cur = 1 - cur;
      }
    }
  }

  // 3. Back to this rank's tokens with all heads.
  if (U > 1) {
    SeqMajor sm;
    sm.s[0] = reinterpret_cast<char*>(buf_.o);
    seq_major_chunks(sm, reinterpret_cast<char*>(buf_.send), 1, U, g.B, g.S, Du * 2, true, s);
    ulysses_->all_to_all(buf_.send, buf_.recv, static_cast<size_t>(rows * Du) * b2, s);
    TokenMajor tm;
    tm.t[0] = reinterpret_cast<char*>(out), tm.ld_bytes[0] = D * 2;
    token_major_chunks(tm, reinterpret_cast<char*>(buf_.recv), 1, U, rows, Du * 2, false, s);
  }
}

}  // namespace wan::cuda
