// Block streaming from disk (WeightResidency::disk, issue 27): when the host cannot pin every expert's
// blocks, their bytes go to one spill file and come back per forward. The file is unlinked as soon as it
// is created (it goes with the process, whatever ends it) and read through the page cache, which the
// kernel may give back under memory pressure; a copier thread reads each requested range into one of
// two pinned staging buffers and copies it from there into its device slot on the copy stream, so the
// read of one block overlaps the copy of the previous one. Forwards that stream this way run without
// CUDA graphs (the compute stream waits on the host for each read).
// Invariants: requests are served in order; a staging buffer is refilled only after its last copy has
// completed; the error of a failed read reaches the next wait().
#pragma once
#include <cuda_runtime.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

namespace wan::cuda {

// The folder of spill files: $TMPDIR, else /tmp.
std::string spill_dir();
// Bytes free for an unprivileged writer in `dir` (statvfs); 0 when it cannot be read.
size_t spill_free_bytes(const std::string& dir);

class BlockSpill {
 public:
  // One file of `experts` regions of region_bytes each in `dir`, and two pinned staging buffers of
  // staging_bytes (the largest range ever written or read at once). Throws wan::Error (naming the
  // folder) when the file cannot be made or sized, or the staging cannot be pinned.
  BlockSpill(const std::string& dir, size_t region_bytes, int experts, size_t staging_bytes, int device,
             cudaStream_t copy);
  ~BlockSpill();
  BlockSpill(const BlockSpill&) = delete;
  BlockSpill& operator=(const BlockSpill&) = delete;

  // Writes `bytes` of device memory `src` to offset `off` of expert e's region (through a staging
  // buffer, in staging-sized pieces). Synchronous; before any request.
  void write_from_device(int e, size_t off, const void* src, size_t bytes);
  // Reads `bytes` at `off` of expert e's region into host memory `dst` (any thread, any time).
  void read(int e, size_t off, void* dst, size_t bytes) const;
  // Queues a copy of `bytes` at `off` of expert e's region into device memory `dst`: on the copy stream,
  // after the work `after` records (recorded before this call), then `loaded` is recorded. Returns the
  // request's number for wait(). bytes <= staging_bytes.
  uint64_t request(int e, size_t off, size_t bytes, void* dst, cudaEvent_t after, cudaEvent_t loaded);
  // Returns once request n's copy and `loaded` are on the copy stream (so a stream may wait on `loaded`);
  // throws the copier's error if a read failed.
  void wait(uint64_t n);
  size_t file_bytes() const { return region_ * static_cast<size_t>(experts_); }

 private:
  struct Request {
    uint64_t n;
    int e;
    size_t off, bytes;
    void* dst;
    cudaEvent_t after, loaded;
  };
  void run();
  void read_exact(size_t at, void* dst, size_t bytes) const;

  std::string path_;  // for messages (the file itself is unlinked)
  int fd_ = -1;
  size_t region_ = 0, staging_bytes_ = 0;
  int experts_ = 0, device_ = 0;
  cudaStream_t copy_ = nullptr;
  char* staging_[2] = {nullptr, nullptr};
  cudaEvent_t staged_[2] = {nullptr, nullptr};  // the last copy out of each staging buffer
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Request> queue_;
  uint64_t issued_ = 0, served_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  // WAN_SPILL_DROP_CACHE=1 (a measurement switch): the file's pages leave the page cache once written and
  // after every read, so each forward reads the disk, as on a host whose memory cannot cache the file.
  bool drop_cache_ = false;
  std::thread copier_;
};

}  // namespace wan::cuda
