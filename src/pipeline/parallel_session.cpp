// ParallelSession (generate_parallel.h): jobs in turn on one in-process launch whose ranks keep their
// DiT. The caller and the ranks meet at one job slot (a mutex and a condition variable: the ranks are
// threads of this process); every rank takes every job, in order, and rank 0 hands the result back.
#include <chrono>
#include <condition_variable>
#include <exception>
#include <thread>

#include "core/error.h"
#include "pipeline/generate_parallel.h"
#include "pipeline/parallel_rank.h"

namespace wan {

// One launch and its job slot. `posted` counts the jobs handed to the ranks, `done` those rank 0 has
// finished (`stopped`: the last one the ranks stopped together, cancelled); `ended` is set when
// dist::launch has returned (`error`: how it failed).
struct ParallelSession::Launch {
  dist::Layout layout;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t posted = 0, done = 0, stopped = 0;
  const GeneratePlan* plan = nullptr;
  const RunHooks* hooks = nullptr;
  bool decode = true, load_only = false;
#ifdef WAN_HAVE_NCCL
  pipeline_detail::RankZeroOut out;
#endif
  bool stop = false, ended = false;
  std::exception_ptr error;
  std::thread thread;
};

namespace {

#ifdef WAN_HAVE_NCCL
// Waits for job number seen + 1 (true) or the session's end (false). Marks progress every 100 ms, so
// an idle rank neither trips the hang watchdog nor misses a failure elsewhere (check_abort throws it).
template <class L>
bool next_job(const dist::RankContext& ctx, L& st, uint64_t seen) {
  std::unique_lock<std::mutex> lock(st.mu);
  for (;;) {
    if (st.posted > seen) return true;
    if (st.stop) return false;
    st.cv.wait_for(lock, std::chrono::milliseconds(100));
    lock.unlock();
    ctx.check_abort();
    lock.lock();
  }
}

template <class L>
void session_rank(dist::RankContext& ctx, L& st) {
  pipeline_detail::RankKeep keep;
  keep.keep_dit = true;
  for (uint64_t seen = 0; next_job(ctx, st, seen);) {
    const GeneratePlan* plan;
    const RunHooks* hooks;
    bool decode, load_only;
    {
      std::lock_guard<std::mutex> lock(st.mu);
      seen = st.posted;
      plan = st.plan;
      hooks = st.hooks;
      decode = st.decode;
      load_only = st.load_only;
    }
    pipeline_detail::RankZeroOut out;
    bool stopped = false;
    try {
      pipeline_detail::rank_job(ctx, *plan, st.layout, *hooks, decode, keep, &out, load_only);
    } catch (const pipeline_detail::StepsStopped&) {
      stopped = true;  // every rank stopped at the same step: the launch and the kept DiT go on
    }
    if (ctx.rank != 0) continue;
    std::lock_guard<std::mutex> lock(st.mu);
    st.out = std::move(out);
    if (stopped) st.stopped = seen;
    st.done = seen;
    st.cv.notify_all();
  }
}
#endif

}  // namespace

ParallelSession::ParallelSession(ParallelRequest req) : req_(std::move(req)) {
  WAN_ASSERT(req_.active() && !req_.launcher, "a parallel session runs in-process on several GPUs");
}

ParallelSession::~ParallelSession() {
  std::lock_guard<std::mutex> lock(run_mu_);
  end_launch();
}

ParallelSessionStats ParallelSession::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

void ParallelSession::end_launch() {
  if (!launch_) return;
  {
    std::lock_guard<std::mutex> lock(launch_->mu);
    launch_->stop = true;
    launch_->cv.notify_all();
  }
  launch_->thread.join();
  launch_.reset();
}

GenerateResult ParallelSession::run(const GeneratePlan& p, const dist::Layout& layout, const RunHooks& hooks,
                                    bool decode, std::vector<ParallelRankStats>* ranks) {
  return post(p, layout, hooks, decode, false, ranks);
}

void ParallelSession::preload(const GeneratePlan& p, const dist::Layout& layout) {
  (void)post(p, layout, RunHooks{}, false, true, nullptr);
}

GenerateResult ParallelSession::post(const GeneratePlan& p, const dist::Layout& layout, const RunHooks& hooks,
                                     bool decode, bool load_only, std::vector<ParallelRankStats>* ranks) {
#ifndef WAN_HAVE_NCCL
  (void)p, (void)layout, (void)hooks, (void)decode, (void)load_only, (void)ranks;
  WAN_THROW("several GPUs (", req_.where(), "): this wan was built without NCCL (configure with CUDA and NCCL)");
#else
  std::lock_guard<std::mutex> run_lock(run_mu_);
  if (launch_) {
    bool ended;
    {
      std::lock_guard<std::mutex> lock(launch_->mu);
      ended = launch_->ended;  // failed while idle (a lost peer): a new launch takes the job
    }
    if (ended || launch_->layout != layout) end_launch();
  }
  if (!launch_) {
    auto l = std::make_shared<Launch>();
    l->layout = layout;
    // The thread holds the launch until stop; it keeps `l` alive for the ranks.
    l->thread = std::thread([l, opts = req_.launch] {
      std::exception_ptr error;
      try {
        dist::launch(opts, [&l](dist::RankContext& ctx) { session_rank(ctx, *l); });
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(l->mu);
      l->error = error;
      l->ended = true;
      l->cv.notify_all();
    });
    launch_ = std::move(l);
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.launches;
  }
  Launch& l = *launch_;
  std::unique_lock<std::mutex> lock(l.mu);
  uint64_t job = 0;  // this job's number (0: not posted)
  if (!l.ended) {
    l.plan = &p;
    l.hooks = &hooks;
    l.decode = decode;
    l.load_only = load_only;
    job = ++l.posted;
    l.cv.notify_all();
    l.cv.wait(lock, [&] { return l.done == job || l.ended; });
  }
  if (job > 0 && l.done == job && l.stopped == job) throw Cancelled();
  if (job > 0 && l.done == job) {
    pipeline_detail::RankZeroOut out = std::move(l.out);
    lock.unlock();
    {
      std::lock_guard<std::mutex> s(stats_mu_);
      stats_.built += static_cast<uint64_t>(out.built);
      stats_.reused += static_cast<uint64_t>(out.reused);
    }
    if (ranks) *ranks = std::move(out.ranks);
    return std::move(out.result);
  }
  // The launch ended before the job did (or before it was posted): its error, and a new launch next time.
  const std::exception_ptr error = l.error;
  lock.unlock();
  end_launch();
  if (hooks.cancel && hooks.cancel->load()) throw Cancelled();
  if (error) std::rethrow_exception(error);
  WAN_THROW("the GPUs' session ended without finishing the job");
#endif
}

}  // namespace wan
