// Where the GPU DiT's weights live (WeightResidency, issue 27's low-memory mode): the allocations and
// fills of each mode, the pointer mapping the forward resolves through, the StreamBlocks copy ring and
// the SwapExperts swap. Not Resident, every expert's weights are filled through device memory (a window:
// the arena, or the slots when larger) exactly as a resident load fills them, then copied to pinned
// host memory (StreamBlocks from disk: written to the spill file, block_spill.h), so every mode runs on
// the same bytes.
// Invariant: a fill through the arena leaves no arena state behind (the RoPE table is written again).
// Invariant (StreamBlocks): every block is copied exactly once per forward, after the block that used
// its slot last, and s waits for block i + 1's copy before block i's last add reads its modulation; so
// a forward's copies are all joined into s (a graph capture's requirement) and no slot is overwritten
// while a kernel reads it.
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "core/error.h"
#include "models/dit/dit_gpu_impl.h"

namespace wan::cuda {

ResidencyState::~ResidencyState() {
  // No throws: the owner synchronised its stream; the copy stream may still hold a forward's copies.
  spill.reset();  // its copier queues on `copy`
  if (copy) cudaStreamSynchronize(copy);
  for (cudaEvent_t e : loaded) cudaEventDestroy(e);
  for (cudaEvent_t e : freed) cudaEventDestroy(e);
  if (fork) cudaEventDestroy(fork);
  if (copy) cudaStreamDestroy(copy);
  if (slots) cudaFree(slots);
  for (const HostImage& h : host) {
    cudaHostUnregister(h.data);
    munmap(h.data, h.bytes);
  }
}

namespace {

// Fills table `t`'s tensors at `dev` from `src` (expert i) as create() fills a resident expert, and
// waits for it: loaded (streamed from the files, merged, quantised) or drawn.
void fill(const DeviceTable& t, void* dev, const DiTWeightSource& src, int i, float* scratch, size_t scratch_floats,
          cudaStream_t s) {
  if (src.random) {
    WAN_ASSERT(dit_gpu_detail::max_small_floats(t) <= scratch_floats, "random weight scratch");
    dit_gpu_detail::draw_random_weights(t, dev, src.seed, scratch, scratch_floats, s, src.merge);
    dit_gpu_detail::apply_weight_merges(t, dev, src.merge, s);
  } else {
    WAN_WITH_CONTEXT(cat("DiT expert ", i),
                     dit_gpu_detail::upload_weights(t, dev, src.get, "DiT", src.span, nullptr, 0, src.merge));
  }
  CUDA_CHECK(cudaStreamSynchronize(s));
}

// Pinned host memory for one expert's weights, kept in st (freed by ~ResidencyState). cudaHostAlloc faults
// and pins every page on one thread (27 GiB: 12 to 20 s on the H100 host); anonymous pages first touched by
// up to 16 threads, then registered in one cudaHostRegister, take 2.6 s there, and copy to the device as
// fast.
char* alloc_host(ResidencyState& st, size_t bytes) {
  auto refuse = [&](const char* why) {
    WAN_THROW("DiT GPU: cannot pin ", gib(bytes), " GiB of host memory for the weights (", why,
              "); give the run more device memory (--memory-budget) or free host memory");
  };
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) refuse(std::strerror(errno));
  char* p = static_cast<char*>(m);
  const size_t threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 16);
  const size_t per = (bytes / threads + 4095) / 4096 * 4096;
  std::vector<std::thread> touch;
  for (size_t k = 0; k * per < bytes; ++k)
    touch.emplace_back([p, k, per, bytes] { std::memset(p + k * per, 0, std::min(per, bytes - k * per)); });
  for (std::thread& t : touch) t.join();
  const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
  if (e != cudaSuccess) {
    cudaGetLastError();
    munmap(p, bytes);
    refuse(cudaGetErrorString(e));
  }
  st.host.push_back({p, bytes});
  return p;
}

}  // namespace

void DiTGpu::Impl::place_weights(const std::vector<DiTWeightSource>& experts) {
  const int n = static_cast<int>(experts.size());
  const WeightResidency r = plan.residency;
  const int layers = cfg.num_layers;
  if (r.mode == WeightResidency::Mode::Resident) {
    for (int i = 0; i < n; ++i) {
      void* w = nullptr;
      CUDA_CHECK(cudaMalloc(&w, table.bytes));
      weights.push_back(w);
      const DiTWeightSource& src = experts[static_cast<size_t>(i)];
      if (src.external) {
        // filled by the caller (weight_allocation)
      } else if (src.random) {
        const size_t scratch = plan.get("big").bytes / 4;  // free until the first forward
        WAN_ASSERT(dit_gpu_detail::max_small_floats(table) <= scratch, "random weight scratch");
        dit_gpu_detail::draw_random_weights(table, w, src.seed, reinterpret_cast<float*>(big), scratch, stream,
                                            src.merge);
        dit_gpu_detail::apply_weight_merges(table, w, src.merge, stream);
      } else {
        WAN_WITH_CONTEXT(cat("DiT expert ", i), dit_gpu_detail::upload_weights(table, w, src.get, "DiT", src.span,
                                                                               src.loader, src.group, src.merge));
      }
      ptrs.push_back(resolve(table, w, layers));
      ptrs.back().expert = i;
    }
    return;
  }

  res = std::make_unique<ResidencyState>();
  ResidencyState& st = *res;
  st.layout = block_layout(table, layers);
  const size_t scratch_floats = std::max<size_t>(dit_gpu_detail::max_small_floats(table), 1);
  float* scratch = nullptr;
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&scratch), scratch_floats * 4));
  struct Free {
    float* p;
    ~Free() { cudaFree(p); }
  } free_scratch{scratch};

  if (r.mode == WeightResidency::Mode::SwapExperts) {
    void* w = nullptr;
    CUDA_CHECK(cudaMalloc(&w, table.bytes));
    weights.push_back(w);
    for (int i = 0; i < n; ++i) {
      fill(table, w, experts[static_cast<size_t>(i)], i, scratch, scratch_floats, stream);
      CUDA_CHECK(cudaMemcpy(alloc_host(st, table.bytes), w, table.bytes, cudaMemcpyDeviceToHost));
      ptrs.push_back(resolve(table, w, layers));
      ptrs.back().expert = i;
    }
    st.on_device = n - 1;
    return;
  }

  // StreamBlocks: the non-block tensors compacted on the device per expert, the blocks in host memory.
  const BlockLayout& L = st.layout;
  st.count = std::min(r.slots, layers);
  st.slot_bytes = plan.block_bytes;
  st.nonblock = sub_table(table, {{0, L.begin, 0}, {L.end, table.bytes, L.begin}});
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&st.slots), st.slot_bytes * static_cast<size_t>(st.count)));
  CUDA_CHECK(cudaStreamCreateWithFlags(&st.copy, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&st.fork, cudaEventDisableTiming));
  for (int k = 0; k < st.count; ++k) {
    cudaEvent_t a = nullptr, b = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&a, cudaEventDisableTiming));
    st.loaded.push_back(a);
    CUDA_CHECK(cudaEventCreateWithFlags(&b, cudaEventDisableTiming));
    st.freed.push_back(b);
  }
  // The fill window: the arena (free until the first forward) or the slots, whichever is larger.
  const size_t ring = st.slot_bytes * static_cast<size_t>(st.count);
  char* window = arena && plan.arena_bytes > ring ? arena : st.slots;
  const size_t window_bytes = window == arena ? plan.arena_bytes : ring;
  if (r.disk) {
    st.spill = std::make_unique<BlockSpill>(spill_dir(), L.end - L.begin, n, st.slot_bytes, opt.device, st.copy);
    st.slot_request.assign(static_cast<size_t>(st.count), 0);
  }
  for (int i = 0; i < n; ++i) {
    const DiTWeightSource& src = experts[static_cast<size_t>(i)];
    void* w = nullptr;
    CUDA_CHECK(cudaMalloc(&w, std::max<size_t>(st.nonblock.bytes, 1)));
    weights.push_back(w);
    fill(st.nonblock, w, src, i, scratch, scratch_floats, stream);
    char* host = r.disk ? nullptr : alloc_host(st, table.bytes);
    for (int a = 0; a < layers;) {  // windows of whole blocks
      int b = a + 1;
      const size_t begin = L.blocks[static_cast<size_t>(a)].first;
      while (b < layers && L.blocks[static_cast<size_t>(b)].second - begin <= window_bytes) ++b;
      const size_t end = L.blocks[static_cast<size_t>(b - 1)].second;
      fill(sub_table(table, {{begin, end, 0}}), window, src, i, scratch, scratch_floats, stream);
      if (host)
        CUDA_CHECK(cudaMemcpy(host + begin, window, end - begin, cudaMemcpyDeviceToHost));
      else
        st.spill->write_from_device(i, begin - L.begin, window, end - begin);
      a = b;
    }
    const char* dev = static_cast<const char*>(w);
    ExpertPtrs p = resolve(
        table,
        [&](size_t off) -> const char* {
          if (off < L.begin) return dev + off;
          if (off >= L.end) return dev + L.begin + (off - L.end);
          // the block holding off: the last whose first byte is <= off
          const auto it = std::upper_bound(L.blocks.begin(), L.blocks.end(), off,
                                           [](size_t o, const std::pair<size_t, size_t>& bl) { return o < bl.first; });
          const size_t j = static_cast<size_t>(it - L.blocks.begin()) - 1;
          return st.slots + (j % static_cast<size_t>(st.count)) * st.slot_bytes + (off - L.blocks[j].first);
        },
        layers);
    p.expert = i;
    ptrs.push_back(std::move(p));
  }
  if (window == arena) write_rope();  // the fills overwrote it
}

void DiTGpu::Impl::stream_begin(int expert, cudaStream_t s) {
  if (!streaming()) return;
  ResidencyState& st = *res;
  CUDA_CHECK(cudaEventRecord(st.fork, s));  // the previous forward's reads of the slots are before it
  CUDA_CHECK(cudaStreamWaitEvent(st.copy, st.fork, 0));
  const BlockLayout& L = st.layout;
  for (int j = 0; j < st.count; ++j) {
    const auto& [b, e] = L.blocks[static_cast<size_t>(j)];
    char* slot = st.slots + static_cast<size_t>(j) * st.slot_bytes;
    if (st.spill) {
      st.slot_request[static_cast<size_t>(j)] =
          st.spill->request(expert, b - L.begin, e - b, slot, st.fork, st.loaded[static_cast<size_t>(j)]);
      continue;
    }
    CUDA_CHECK(cudaMemcpyAsync(slot, st.host[static_cast<size_t>(expert)].data + b, e - b, cudaMemcpyHostToDevice,
                               st.copy));
    CUDA_CHECK(cudaEventRecord(st.loaded[static_cast<size_t>(j)], st.copy));
  }
}

void DiTGpu::Impl::stream_next(int expert, int block, cudaStream_t s) {
  if (!streaming()) return;
  ResidencyState& st = *res;
  const int next = block + st.count;
  if (next >= cfg.num_layers) return;
  const size_t slot = static_cast<size_t>(block % st.count);
  CUDA_CHECK(cudaEventRecord(st.freed[slot], s));
  const auto& [b, e] = st.layout.blocks[static_cast<size_t>(next)];
  if (st.spill) {  // the copier waits for `freed` (not recorded again before this request is served)
    st.slot_request[slot] =
        st.spill->request(expert, b - st.layout.begin, e - b, st.slots + slot * st.slot_bytes, st.freed[slot],
                          st.loaded[slot]);
    return;
  }
  CUDA_CHECK(cudaStreamWaitEvent(st.copy, st.freed[slot], 0));
  CUDA_CHECK(cudaMemcpyAsync(st.slots + slot * st.slot_bytes, st.host[static_cast<size_t>(expert)].data + b, e - b,
                             cudaMemcpyHostToDevice, st.copy));
  CUDA_CHECK(cudaEventRecord(st.loaded[slot], st.copy));
}

void DiTGpu::Impl::swap_in(int expert, cudaStream_t s) {
  if (!res || plan.residency.mode != WeightResidency::Mode::SwapExperts || res->on_device == expert) return;
  CUDA_CHECK(cudaMemcpyAsync(weights[0], res->host[static_cast<size_t>(expert)].data, table.bytes,
                             cudaMemcpyHostToDevice, s));
  res->on_device = expert;
}

Tensor DiTGpu::Impl::download(int expert, const std::string& name) const {
  const size_t e = static_cast<size_t>(expert);
  if (!res) return dit_gpu_detail::download_weight(table, weights[e], name);
  if (streaming() && res->nonblock.index.count(name))
    return dit_gpu_detail::download_weight(res->nonblock, weights[e], name);
  // From the host image through a device buffer: the tensor's unit of weight_ranges (itself, or its e4m3
  // fusion group with the scales behind it).
  const size_t at = table.at(name).offset;
  size_t begin = 0, bytes = 0;
  for (const auto& [b, n] : DiTGpu::weight_ranges(cfg, nullptr, plan.gemm))
    if (b <= at && at < b + n) begin = b, bytes = n;
  WAN_ASSERT(bytes > 0, "DiT GPU: no weight range holds ", name);
  void* tmp = nullptr;
  CUDA_CHECK(cudaMalloc(&tmp, bytes));
  struct Free {
    void* p;
    ~Free() { cudaFree(p); }
  } f{tmp};
  if (res->spill) {  // a unit within the blocks (the non-block ones are on the device)
    std::vector<char> h(bytes);
    res->spill->read(expert, begin - res->layout.begin, h.data(), bytes);
    CUDA_CHECK(cudaMemcpy(tmp, h.data(), bytes, cudaMemcpyHostToDevice));
  } else {
    CUDA_CHECK(cudaMemcpy(tmp, res->host[e].data + begin, bytes, cudaMemcpyHostToDevice));
  }
  return dit_gpu_detail::download_weight(sub_table(table, {{begin, begin + bytes, 0}}), tmp, name);
}

}  // namespace wan::cuda
