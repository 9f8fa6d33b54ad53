// GPU GGUF dequantisation (kernels/gguf_dequant.h) against the CPU reference (formats/gguf_quant.h,
// itself bit-identical to gguf-py: tests/cpu/test_gguf.cpp): f32 output bit for bit, bf16 output equal
// to core/dtype.h's rounding of the CPU's f32. Inputs: the fixture's random blocks of every supported
// type (tests/fixtures/gguf/dequant.gguf) and larger random blocks drawn here, to aligned and
// misaligned destinations, with tails that are not whole 8-element groups. Skips without a device.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "formats/gguf.h"
#include "formats/gguf_quant.h"
#include "kernels/check.h"
#include "kernels/gguf_dequant.h"
#include "kernels/rng.h"  // device_count

using namespace wan;

#define REQUIRE_GPU() \
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"

namespace {

const GgmlType kTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
                           GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,
                           GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

// Byte offsets of a block's f16 scale fields (kept finite so the comparison sees numbers).
std::vector<int> scale_fields(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: return {0};
    case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K: return {0, 2};
    case GgmlType::Q2_K: return {80, 82};
    case GgmlType::Q3_K: return {108};
    case GgmlType::Q6_K: return {208};
    default: return {};
  }
}

std::string random_blocks(GgmlType t, int64_t n_elements, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string b(ggml_nbytes(t, static_cast<uint64_t>(n_elements)), '\0');
  for (char& c : b) c = static_cast<char>(rng());
  const GgmlTypeInfo& info = ggml_info(t);
  auto finite16 = [&](size_t at) {
    uint16_t h = static_cast<uint16_t>(rng());
    if ((h & 0x7C00) == 0x7C00) h &= 0xBFFF;
    b[at] = static_cast<char>(h & 0xFF);
    b[at + 1] = static_cast<char>(h >> 8);
  };
  const int64_t blocks = n_elements / info.block_size;
  for (int64_t k = 0; k < blocks; ++k) {
    if (t == GgmlType::F16) finite16(static_cast<size_t>(k) * 2);
    if (t == GgmlType::F32) {
      const float f = static_cast<float>(static_cast<int64_t>(rng() % 2000001) - 1000000) * 1e-3f;
      std::memcpy(&b[static_cast<size_t>(k) * 4], &f, 4);
    }
    for (int off : scale_fields(t)) finite16(static_cast<size_t>(k) * info.type_size + off);
  }
  return b;
}

// Dequantises `blocks` on the device into dst at element offset `shift` (misaligned when odd) and
// compares with the CPU: f32 bitwise, bf16 to the rounded CPU values.
void check(GgmlType t, const std::string& blocks, int64_t n, int shift) {
  SCOPED_TRACE(std::string(ggml_type_name(t)) + " n=" + std::to_string(n) + " shift=" + std::to_string(shift));
  std::vector<float> cpu(static_cast<size_t>(n));
  gguf_dequantize(t, blocks.data(), n, cpu.data());
  void* src = nullptr;
  void* dst = nullptr;
  CUDA_CHECK(cudaMalloc(&src, blocks.size() + 1));
  CUDA_CHECK(cudaMalloc(&dst, static_cast<size_t>(n + shift) * 4 + 16));
  CUDA_CHECK(cudaMemcpy(src, blocks.data(), blocks.size(), cudaMemcpyHostToDevice));
  for (DType dt : {DType::F32, DType::BF16}) {
    const size_t es = dtype_size(dt);
    char* out = static_cast<char*>(dst) + shift * es;
    CUDA_CHECK(cudaMemset(dst, 0xFF, static_cast<size_t>(n + shift) * 4 + 16));
    cuda::gguf_dequantize_gpu(static_cast<uint32_t>(t), src, n, out, dt, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<char> got(static_cast<size_t>(n) * es + es);
    CUDA_CHECK(cudaMemcpy(got.data(), out, got.size(), cudaMemcpyDeviceToHost));
    size_t bad = 0, first = 0;
    for (int64_t i = 0; i < n; ++i) {
      bool same;
      if (dt == DType::F32) {
        same = std::memcmp(&got[i * 4], &cpu[i], 4) == 0;
      } else {
        const uint16_t want = f32_to_bf16(cpu[i]);
        same = std::memcmp(&got[i * 2], &want, 2) == 0;
      }
      if (!same && bad++ == 0) first = static_cast<size_t>(i);
    }
    EXPECT_EQ(bad, 0u) << dtype_name(dt) << ": first difference at element " << first;
    // The element after the last is untouched (0xFF poison).
    for (size_t k = 0; k < es; ++k) EXPECT_EQ(static_cast<uint8_t>(got[n * es + k]), 0xFF) << dtype_name(dt);
  }
  CUDA_CHECK(cudaFree(src));
  CUDA_CHECK(cudaFree(dst));
}

}  // namespace

TEST(GgufGpu, SupportAndArguments) {
  for (GgmlType t : kTypes) EXPECT_TRUE(cuda::gguf_gpu_supported(static_cast<uint32_t>(t))) << ggml_type_name(t);
  EXPECT_FALSE(cuda::gguf_gpu_supported(static_cast<uint32_t>(GgmlType::IQ4_XS)));
  EXPECT_FALSE(cuda::gguf_gpu_supported(4));
  EXPECT_THROW(cuda::gguf_dequantize_gpu(16, nullptr, 256, nullptr, DType::F32, nullptr), Error);
  EXPECT_THROW(cuda::gguf_dequantize_gpu(12, nullptr, 128, nullptr, DType::F32, nullptr), Error);
  EXPECT_THROW(cuda::gguf_dequantize_gpu(8, nullptr, 32, nullptr, DType::F16, nullptr), Error);
  // Nothing to do: no launch, no device needed.
  cuda::gguf_dequantize_gpu(8, nullptr, 0, nullptr, DType::F32, nullptr);
}

TEST(GgufGpu, FixtureBlocksMatchCpu) {
  REQUIRE_GPU();
  auto f = GgufFile::open(std::string(WAN_FIXTURES) + "/gguf/dequant.gguf");
  for (GgmlType t : kTypes) {
    const GgufTensorInfo* q = f->find(std::string("q.") + ggml_type_name(t));
    ASSERT_TRUE(q) << ggml_type_name(t);
    const std::string bytes(reinterpret_cast<const char*>(f->tensor_data(*q)), q->nbytes);
    check(t, bytes, static_cast<int64_t>(q->numel), 0);
    check(t, bytes, static_cast<int64_t>(q->numel), 1);
  }
}

TEST(GgufGpu, RandomBlocksMatchCpu) {
  REQUIRE_GPU();
  uint64_t seed = 1;
  for (GgmlType t : kTypes) {
    const int64_t bs = ggml_info(t).block_size;
    for (int64_t n : {bs, bs * 3, bs * 4099}) {
      const std::string b = random_blocks(t, n, seed++);
      check(t, b, n, 0);
      check(t, b, n, 3);
    }
    if (bs == 1) {  // plain types: tails that are not whole 8-element groups
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{13}, int64_t{100003}}) check(t, random_blocks(t, n, seed++), n, 0);
    }
  }
}
