// BlockSpill (block_spill.h): the spill file, its writes and reads, and the copier thread.
#include "models/dit/block_spill.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/check.h"

namespace wan::cuda {

std::string spill_dir() {
  const char* t = std::getenv("TMPDIR");
  return t && *t ? std::string(t) : std::string("/tmp");
}

size_t spill_free_bytes(const std::string& dir) {
  struct statvfs v {};
  if (statvfs(dir.c_str(), &v) != 0) return 0;
  return static_cast<size_t>(v.f_bavail) * static_cast<size_t>(v.f_frsize);
}

BlockSpill::BlockSpill(const std::string& dir, size_t region_bytes, int experts, size_t staging_bytes, int device,
                       cudaStream_t copy)
    : region_(region_bytes), staging_bytes_(std::max<size_t>(staging_bytes, 1)), experts_(experts), device_(device),
      copy_(copy) {
  std::vector<char> name(dir.begin(), dir.end());
  const std::string tail = "/wan-spill-XXXXXX";
  name.insert(name.end(), tail.begin(), tail.end());
  name.push_back('\0');
  fd_ = mkstemp(name.data());
  WAN_CHECK(fd_ >= 0, "block streaming from disk: cannot create a spill file in ", dir, " (", std::strerror(errno),
            "); set TMPDIR to a writable folder with room for the weights");
  path_ = name.data();
  unlink(path_.c_str());  // goes with the process
  const size_t total = file_bytes();
  int r = posix_fallocate(fd_, 0, static_cast<off_t>(total));
  // A file system without preallocation: a sparse file (the plan checked the folder's room).
  if ((r == EOPNOTSUPP || r == EINVAL) && ftruncate(fd_, static_cast<off_t>(total)) == 0) r = 0;
  if (r != 0) {
    close(fd_);
    WAN_THROW("block streaming from disk: cannot reserve ", total >> 20, " MiB in ", dir, " (", std::strerror(r),
              "); set TMPDIR to a folder with room for the weights");
  }
  for (int k = 0; k < 2; ++k) {
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, staging_bytes_, cudaHostAllocDefault);
    if (e != cudaSuccess) {
      cudaGetLastError();
      for (int j = 0; j < k; ++j) cudaFreeHost(staging_[j]);
      close(fd_);
      WAN_THROW("block streaming from disk: cannot pin ", staging_bytes_ >> 20, " MiB of staging (",
                cudaGetErrorString(e), ")");
    }
    staging_[k] = static_cast<char*>(p);
    CUDA_CHECK(cudaEventCreateWithFlags(&staged_[k], cudaEventDisableTiming));
  }
  const char* drop = std::getenv("WAN_SPILL_DROP_CACHE");
  drop_cache_ = drop && drop[0] == '1';
  copier_ = std::thread([this] { run(); });
}

BlockSpill::~BlockSpill() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (copier_.joinable()) copier_.join();
  for (int k = 0; k < 2; ++k) {
    if (staged_[k]) {
      cudaEventSynchronize(staged_[k]);
      cudaEventDestroy(staged_[k]);
    }
    if (staging_[k]) cudaFreeHost(staging_[k]);
  }
  if (fd_ >= 0) close(fd_);
}

void BlockSpill::read_exact(size_t at, void* dst, size_t bytes) const {
  char* p = static_cast<char*>(dst);
  while (bytes > 0) {
    const ssize_t n = pread(fd_, p, std::min<size_t>(bytes, size_t{1} << 30), static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    WAN_CHECK(n > 0, "block streaming from disk: reading the spill file in ", path_, " failed (",
              n < 0 ? std::strerror(errno) : "end of file", ")");
    p += n, at += static_cast<size_t>(n), bytes -= static_cast<size_t>(n);
  }
}

void BlockSpill::write_from_device(int e, size_t off, const void* src, size_t bytes) {
  WAN_ASSERT(e >= 0 && e < experts_ && off + bytes <= region_, "spill write outside expert ", e, "'s region");
  const char* s = static_cast<const char*>(src);
  size_t at = static_cast<size_t>(e) * region_ + off;
  while (bytes > 0) {
    const size_t n = std::min(bytes, staging_bytes_);
    CUDA_CHECK(cudaMemcpy(staging_[0], s, n, cudaMemcpyDeviceToHost));
    for (size_t done = 0; done < n;) {
      const ssize_t w = pwrite(fd_, staging_[0] + done, n - done, static_cast<off_t>(at + done));
      if (w < 0 && errno == EINTR) continue;
      WAN_CHECK(w > 0, "block streaming from disk: writing the spill file in ", path_, " failed (",
                w < 0 ? std::strerror(errno) : "no progress", ")");
      done += static_cast<size_t>(w);
    }
    s += n, at += n, bytes -= n;
  }
}

void BlockSpill::read(int e, size_t off, void* dst, size_t bytes) const {
  WAN_ASSERT(e >= 0 && e < experts_ && off + bytes <= region_, "spill read outside expert ", e, "'s region");
  read_exact(static_cast<size_t>(e) * region_ + off, dst, bytes);
}

uint64_t BlockSpill::request(int e, size_t off, size_t bytes, void* dst, cudaEvent_t after, cudaEvent_t loaded) {
  WAN_ASSERT(e >= 0 && e < experts_ && off + bytes <= region_ && bytes <= staging_bytes_, "spill request of ", bytes,
             " bytes at ", off, " of expert ", e);
  std::lock_guard<std::mutex> lk(mu_);
  const uint64_t n = ++issued_;
  queue_.push_back(Request{n, e, off, bytes, dst, after, loaded});
  cv_.notify_all();
  return n;
}

void BlockSpill::wait(uint64_t n) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return served_ >= n || error_; });
  if (error_) std::rethrow_exception(error_);
}

void BlockSpill::run() {
  if (cudaSetDevice(device_) != cudaSuccess) {
    std::lock_guard<std::mutex> lk(mu_);
    error_ = std::make_exception_ptr(Error("block streaming from disk: the copier cannot select its GPU"));
    cv_.notify_all();
    return;
  }
  int k = 0;  // the staging buffer the next read fills
  bool written = false;
  for (;;) {
    Request q;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      q = queue_.front();
      queue_.pop_front();
    }
    try {
      const size_t at = static_cast<size_t>(q.e) * region_ + q.off;
      if (drop_cache_ && !written) {  // the writes are done: onto the disk, out of the page cache
        WAN_CHECK(fdatasync(fd_) == 0, "block streaming from disk: syncing the spill file failed (",
                  std::strerror(errno), ")");
        (void)posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
      }
      written = true;
      CUDA_CHECK(cudaEventSynchronize(staged_[k]));  // its previous copy has left the buffer
      read_exact(at, staging_[k], q.bytes);
      if (drop_cache_) (void)posix_fadvise(fd_, static_cast<off_t>(at), static_cast<off_t>(q.bytes), POSIX_FADV_DONTNEED);
      CUDA_CHECK(cudaStreamWaitEvent(copy_, q.after, 0));
      CUDA_CHECK(cudaMemcpyAsync(q.dst, staging_[k], q.bytes, cudaMemcpyHostToDevice, copy_));
      CUDA_CHECK(cudaEventRecord(staged_[k], copy_));
      CUDA_CHECK(cudaEventRecord(q.loaded, copy_));
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu_);
      error_ = std::current_exception();
      cv_.notify_all();
      return;
    }
    k ^= 1;
    std::lock_guard<std::mutex> lk(mu_);
    served_ = q.n;
    cv_.notify_all();
  }
}

}  // namespace wan::cuda
