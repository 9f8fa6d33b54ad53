// NCCL communicator wrapper: the collectives the parallel DiT forward needs, implementing
// cuda::SeqComm (src/kernels/seq_comm.h) so the model code stays free of NCCL, plus sub-group splits.
//   all_to_all     grouped ncclSend/ncclRecv of equal chunks (the local chunk is a device copy)
//   all_gather     ncclAllGather (in place allowed as NCCL allows it)
//   ring_exchange  grouped ncclSend to rank+1 / ncclRecv from rank-1
//   broadcast      ncclBroadcast; send / recv: point to point
//   split          ncclCommSplit (collective over every rank of this communicator)
// Every operation is enqueued on a stream, returns without synchronising and can be captured in a CUDA
// graph. Bytes move as ncclUint8, so any element type works.
//
// Invariants: a Comm either owns its ncclComm_t (destroyed with it) or only borrows it (the launcher's
// world communicator, or a split handed to RankContext::register_comm, which the launcher destroys or
// aborts). NCCL errors become wan::Error through NCCL_CHECK (statement, NCCL's message, file, line).
// Not thread-safe: one Comm per rank thread.
#pragma once
#ifdef WAN_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <functional>
#include <memory>

#include "kernels/seq_comm.h"

namespace wan::dist {

class Comm final : public cuda::SeqComm {
 public:
  Comm(ncclComm_t c, bool owned);
  ~Comm() override;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  ncclComm_t get() const { return comm_; }

  void all_to_all(const void* send, void* recv, size_t chunk_bytes, cudaStream_t stream) override;
  void all_gather(const void* send, void* recv, size_t bytes, cudaStream_t stream) override;
  void ring_exchange(const void* send, void* recv, size_t bytes, cudaStream_t stream) override;
  void broadcast(void* buf, size_t bytes, int root, cudaStream_t stream) override;
  void send(const void* buf, size_t bytes, int peer, cudaStream_t stream);
  void recv(void* buf, size_t bytes, int peer, cudaStream_t stream);
  // Maximum of one fp64 value per rank over the communicator (host in, host out; synchronises `stream`).
  double all_reduce_max_host(double v, cudaStream_t stream);

  // Ranks with the same color form a new communicator, ranked by key (ties by this rank). Every rank of
  // this communicator must call it. `adopt`, when given, receives the new ncclComm_t and takes ownership
  // (RankContext::register_comm); otherwise the returned Comm owns it.
  std::unique_ptr<Comm> split(int color, int key, const std::function<void(ncclComm_t)>& adopt = {}) const;

 private:
  ncclComm_t comm_ = nullptr;
  bool owned_ = false;
  int rank_ = 0, size_ = 1;
};

}  // namespace wan::dist
#endif  // WAN_HAVE_NCCL
