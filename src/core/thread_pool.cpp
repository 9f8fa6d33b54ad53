// Persistent worker threads serving one parallel_for at a time.
// Invariants: a parallel_for from inside a worker (nested) runs serially on the caller; calls from
// different outside threads are serialised by a mutex; the caller participates in the work.
#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace wan {
namespace {

thread_local bool t_in_parallel = false;

class Pool {
 public:
  explicit Pool(int n) : n_(n) {
    for (int i = 1; i < n_; ++i) workers_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
      ++gen_;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return n_; }

  void run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    std::lock_guard<std::mutex> call_lock(call_m_);
    int64_t chunks = std::min<int64_t>((n + grain - 1) / grain, static_cast<int64_t>(n_) * 4);
    chunks = std::max<int64_t>(chunks, 1);
    {
      std::lock_guard<std::mutex> lk(m_);
      fn_ = &fn;
      n_items_ = n;
      n_chunks_ = chunks;
      next_.store(0);
      pending_ = static_cast<int>(workers_.size());
      error_ = nullptr;
      ++gen_;
    }
    cv_.notify_all();
    work();
    std::unique_lock<std::mutex> lk(m_);
    done_cv_.wait(lk, [&] { return pending_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work() {
    t_in_parallel = true;
    for (;;) {
      int64_t c = next_.fetch_add(1);
      if (c >= n_chunks_) break;
      int64_t b = n_items_ * c / n_chunks_, e = n_items_ * (c + 1) / n_chunks_;
      try {
        if (b < e) (*fn_)(b, e);
      } catch (...) {
        std::lock_guard<std::mutex> lk(m_);
        if (!error_) error_ = std::current_exception();
      }
    }
    t_in_parallel = false;
  }
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return gen_ != seen; });
        seen = gen_;
        if (stop_) return;
      }
      work();
      {
        std::lock_guard<std::mutex> lk(m_);
        if (--pending_ == 0) done_cv_.notify_one();
      }
    }
  }

  int n_;
  std::vector<std::thread> workers_;
  std::mutex call_m_, m_;
  std::condition_variable cv_, done_cv_;
  uint64_t gen_ = 0;
  bool stop_ = false;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_items_ = 0, n_chunks_ = 0;
  std::atomic<int64_t> next_{0};
  int pending_ = 0;
  std::exception_ptr error_;
};

int configured_threads() {
  if (const char* e = std::getenv("WAN_THREADS")) {
    int v = std::atoi(e);
    if (v > 0) return v;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

Pool& pool() {
  static Pool p(configured_threads());
  return p;
}

}  // namespace

int num_threads() { return pool().size(); }

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (t_in_parallel || n <= grain || pool().size() == 1) {
    fn(0, n);
    return;
  }
  pool().run(n, grain, fn);
}

}  // namespace wan
