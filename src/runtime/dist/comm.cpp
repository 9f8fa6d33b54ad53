// NCCL collectives behind cuda::SeqComm (see comm.h).
#ifdef WAN_HAVE_NCCL
#include "runtime/dist/comm.h"

#include "core/error.h"
#include "kernels/check.h"

namespace wan::dist {

Comm::Comm(ncclComm_t c, bool owned) : comm_(c), owned_(owned) {
  WAN_CHECK(c != nullptr, "Comm: null NCCL communicator");
  NCCL_CHECK(ncclCommUserRank(c, &rank_));
  NCCL_CHECK(ncclCommCount(c, &size_));
}

Comm::~Comm() {
  if (owned_ && comm_) ncclCommDestroy(comm_);
}

void Comm::all_to_all(const void* send, void* recv, size_t chunk_bytes, cudaStream_t s) {
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  // The local chunk first (a device copy), then the peers in one group so NCCL schedules them together.
  CUDA_CHECK(cudaMemcpyAsync(out + rank_ * chunk_bytes, in + rank_ * chunk_bytes, chunk_bytes,
                             cudaMemcpyDeviceToDevice, s));
  if (size_ == 1) return;
  NCCL_CHECK(ncclGroupStart());
  for (int j = 0; j < size_; ++j) {
    if (j == rank_) continue;
    NCCL_CHECK(ncclSend(in + j * chunk_bytes, chunk_bytes, ncclUint8, j, comm_, s));
    NCCL_CHECK(ncclRecv(out + j * chunk_bytes, chunk_bytes, ncclUint8, j, comm_, s));
  }
  NCCL_CHECK(ncclGroupEnd());
}

void Comm::all_gather(const void* send, void* recv, size_t bytes, cudaStream_t s) {
  NCCL_CHECK(ncclAllGather(send, recv, bytes, ncclUint8, comm_, s));
}

void Comm::ring_exchange(const void* send, void* recv, size_t bytes, cudaStream_t s) {
  WAN_CHECK(size_ > 1, "ring exchange on a communicator of one rank");
  const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
  NCCL_CHECK(ncclGroupStart());
  NCCL_CHECK(ncclSend(send, bytes, ncclUint8, next, comm_, s));
  NCCL_CHECK(ncclRecv(recv, bytes, ncclUint8, prev, comm_, s));
  NCCL_CHECK(ncclGroupEnd());
}

void Comm::broadcast(void* buf, size_t bytes, int root, cudaStream_t s) {
  WAN_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " outside 0..", size_ - 1);
  NCCL_CHECK(ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm_, s));
}

void Comm::send(const void* buf, size_t bytes, int peer, cudaStream_t s) {
  NCCL_CHECK(ncclSend(buf, bytes, ncclUint8, peer, comm_, s));
}

void Comm::recv(void* buf, size_t bytes, int peer, cudaStream_t s) {
  NCCL_CHECK(ncclRecv(buf, bytes, ncclUint8, peer, comm_, s));
}

double Comm::all_reduce_max_host(double v, cudaStream_t s) {
  double* d = nullptr;
  CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&d), sizeof(double), s));
  double r = 0;
  try {
    CUDA_CHECK(cudaMemcpyAsync(d, &v, sizeof v, cudaMemcpyHostToDevice, s));
    NCCL_CHECK(ncclAllReduce(d, d, 1, ncclFloat64, ncclMax, comm_, s));
    CUDA_CHECK(cudaMemcpyAsync(&r, d, sizeof r, cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
  } catch (...) {
    cudaFreeAsync(d, s);
    throw;
  }
  CUDA_CHECK(cudaFreeAsync(d, s));
  return r;
}

std::unique_ptr<Comm> Comm::split(int color, int key, const std::function<void(ncclComm_t)>& adopt) const {
  WAN_CHECK(color >= 0, "Comm::split: negative color ", color);
  ncclComm_t c = nullptr;
  NCCL_CHECK(ncclCommSplit(comm_, color, key, &c, nullptr));
  WAN_CHECK(c != nullptr, "ncclCommSplit returned no communicator for color ", color);
  if (adopt) {
    adopt(c);
    return std::make_unique<Comm>(c, false);
  }
  return std::make_unique<Comm>(c, true);
}

}  // namespace wan::dist
#endif  // WAN_HAVE_NCCL
