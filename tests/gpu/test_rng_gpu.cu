// The GPU normal stream is bit-identical to the CPU one for the same (seed, index).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/philox.h"
#include "kernels/check.h"
#include "kernels/rng.h"

using namespace wan;

#define REQUIRE_GPU() \
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"

TEST(GpuRng, NormalBitIdenticalToCpu) {
  REQUIRE_GPU();
  for (uint64_t seed : {0ull, 42ull, 0xDEADBEEFCAFEull}) {
    const size_t n = (1 << 22) + 17;
    const uint64_t offset = 123456789ull;
    float* d = nullptr;
    CUDA_CHECK(cudaMalloc(&d, n * 4));
    cuda::philox_normal_fill(d, n, seed, offset, nullptr);
    std::vector<float> g(n), c(n);
    CUDA_CHECK(cudaMemcpy(g.data(), d, n * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(d));
    philox_normal_fill(seed, offset, c.data(), n);
    size_t mismatches = 0;
    for (size_t i = 0; i < n; ++i) mismatches += memcmp(&g[i], &c[i], 4) != 0;
    EXPECT_EQ(mismatches, 0u) << "seed " << seed;
  }
}

TEST(GpuRng, Bf16FillMatchesCpuRounding) {
  REQUIRE_GPU();
  const size_t n = 1 << 20;
  uint16_t* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, n * 2));
  cuda::philox_normal_fill_bf16(d, n, 7, 0, 0.02f, nullptr);
  std::vector<uint16_t> g(n);
  CUDA_CHECK(cudaMemcpy(g.data(), d, n * 2, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaFree(d));
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(g[i], f32_to_bf16(philox_normal(7, i) * 0.02f)) << i;
}

TEST(GpuCheck, ErrorsCarryContext) {
  REQUIRE_GPU();
  try {
    CUDA_CHECK(cudaMemcpy(nullptr, reinterpret_cast<void*>(16), 1 << 20, cudaMemcpyDeviceToHost));
    FAIL() << "expected an error";
  } catch (const wan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cudaMemcpy"), std::string::npos) << e.what();
  }
  cudaGetLastError();
}
