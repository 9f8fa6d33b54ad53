// Pinning 27 GiB of host memory three ways (bench/results/lowmem-pinning-2026-11-27.json): cudaHostAlloc;
// mmap + first touch by T threads + one cudaHostRegister (what alloc_host in dit_gpu_residency.cpp does);
// mmap + one cudaHostRegister per thread chunk. Build: nvcc -O2 -std=c++17 -o pin pin_host.cu -lpthread;
// run: ./pin GIB THREADS.
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
int main(int argc, char** argv) {
  const size_t bytes = (argc > 1 ? atoll(argv[1]) : 27) * (size_t(1) << 30);
  const int T = argc > 2 ? atoi(argv[2]) : 16;
  CK(cudaFree(0));
  void* d = nullptr; CK(cudaMalloc(&d, size_t(1) << 30));
  auto h2d = [&](void* h) { double t = now(); for (int i = 0; i < 4; ++i) cudaMemcpy(d, (char*)h + i * (size_t(1) << 30), size_t(1) << 30, cudaMemcpyHostToDevice); return 4.0 / (now() - t); };
  { double t = now(); void* p = nullptr; CK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault)); double a = now() - t;
    printf("cudaHostAlloc %zu GiB: %.2f s (%.1f GB/s); H2D %.1f GiB/s\n", bytes >> 30, a, bytes / a / 1e9, h2d(p));
    t = now(); cudaFreeHost(p); printf("  free %.2f s\n", now() - t); }
  { double t = now(); char* p = (char*)mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    std::vector<std::thread> th; const size_t per = (bytes / T + 4095) / 4096 * 4096;
    for (int k = 0; k < T; ++k) th.emplace_back([=] { size_t b = k * per; if (b < bytes) memset(p + b, 0, std::min(per, bytes - b)); });
    for (auto& x : th) x.join();
    double a = now() - t; t = now(); CK(cudaHostRegister(p, bytes, cudaHostRegisterDefault)); double r = now() - t;
    printf("mmap + %d-thread touch %.2f s + one cudaHostRegister %.2f s = %.2f s; H2D %.1f GiB/s\n", T, a, r, a + r, h2d(p));
    cudaHostUnregister(p); munmap(p, bytes); }
  { double t = now(); char* p = (char*)mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    std::vector<std::thread> th; const size_t per = (bytes / T + 4095) / 4096 * 4096; std::vector<int> ok(T, 1);
    for (int k = 0; k < T; ++k) th.emplace_back([=, &ok] { size_t b = k * per; if (b < bytes) ok[k] = cudaHostRegister(p + b, std::min(per, bytes - b), cudaHostRegisterDefault) == cudaSuccess; });
    for (auto& x : th) x.join();
    double a = now() - t; int good = 0; for (int v : ok) good += v;
    printf("mmap + %d threads each cudaHostRegister its chunk: %.2f s (%d ok); H2D within one chunk %.1f GiB/s\n", T, a, good, h2d(p));
    for (int k = 0; k < T; ++k) { size_t b = k * per; if (b < bytes) cudaHostUnregister(p + b); }
    munmap(p, bytes); }
  return 0;
}
