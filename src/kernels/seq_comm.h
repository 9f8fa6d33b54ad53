// The communication a parallel DiT forward needs, as an abstract interface: the model (wan_models) must
// not depend on NCCL, so DiTGpu talks to its peers through SeqComm and wan_runtime implements it with
// NCCL (src/runtime/dist/comm.h). All operations move raw bytes, are enqueued on a CUDA stream, never
// synchronise the host and are capturable in CUDA graphs (NCCL's are), so a parallel forward can still
// be replayed as one graph per rank.
//
// Invariants:
// - Every rank of a group calls the same operations in the same order with the same byte counts (a
//   collective); a rank that skips one hangs its peers until the launcher aborts the group.
// - Buffers are device memory; `send` and `recv` do not overlap except where an operation says so.
// - rank() and size() are fixed for the life of the object.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace wan::cuda {

class SeqComm {
 public:
  virtual ~SeqComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // All-to-all of equal chunks: send holds size() chunks of chunk_bytes, chunk j goes to rank j; recv
  // receives size() chunks, chunk j from rank j (recv chunk rank() is a copy of send chunk rank()).
  virtual void all_to_all(const void* send, void* recv, size_t chunk_bytes, cudaStream_t stream) = 0;
  // All-gather: recv[j·bytes, (j+1)·bytes) = rank j's send. In place when send == recv + rank()·bytes.
  virtual void all_gather(const void* send, void* recv, size_t bytes, cudaStream_t stream) = 0;
  // Ring step: sends `send` to rank (rank()+1) % size() and receives rank (rank()-1) % size()'s into recv.
  virtual void ring_exchange(const void* send, void* recv, size_t bytes, cudaStream_t stream) = 0;
  // Broadcast of `bytes` from rank `root` (in place: buf is the source on root, the destination elsewhere).
  virtual void broadcast(void* buf, size_t bytes, int root, cudaStream_t stream) = 0;
};

}  // namespace wan::cuda
