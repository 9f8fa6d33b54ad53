// Tensor views, aligned allocation, the thread pool and error context.
#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/philox.h"
#include "core/printable.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

using namespace wan;

TEST(Tensor, ShapesStridesAndConversion) {
  Tensor t = Tensor::f32({2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  EXPECT_EQ(t.view().stride[0], 12);
  EXPECT_EQ(t.view().stride[2], 1);
  EXPECT_TRUE(t.view().is_contiguous());
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = philox_normal(5, i);
  Tensor b = t.to(DType::BF16);
  EXPECT_EQ(b.dtype(), DType::BF16);
  Tensor back = b.to_f32();
  for (int64_t i = 0; i < t.numel(); ++i)
    EXPECT_EQ(back.f32()[i], bf16_to_f32(f32_to_bf16(t.f32()[i])));
  Tensor r = t.reshape({6, 4});
  EXPECT_EQ(r.data(), t.data());
  EXPECT_THROW(t.reshape({5, 5}), Error);
  EXPECT_EQ(Shape({2, 3}).str(), "[2, 3]");
  TensorView v = t.view();
  std::swap(v.stride[0], v.stride[2]);
  EXPECT_FALSE(v.is_contiguous());
  Tensor c = t.clone();
  EXPECT_NE(c.data(), t.data());
  EXPECT_EQ(memcmp(c.data(), t.data(), t.nbytes()), 0);
}

TEST(ThreadPool, CoversRangeOnceAndRethrows) {
  const int64_t n = 100003;
  std::vector<std::atomic<int>> hits(n);
  parallel_for(n, 7, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[i]++;
    // Nested calls run serially and still cover their range.
    std::atomic<int> inner{0};
    parallel_for(10, 1, [&](int64_t bb, int64_t ee) { inner += static_cast<int>(ee - bb); });
    EXPECT_EQ(inner.load(), 10);
  });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
  EXPECT_THROW(parallel_for(1000, 1,
                            [&](int64_t b, int64_t) {
                              if (b > 500) WAN_THROW("boom at ", b);
                            }),
               Error);
  // The pool is still usable after an exception.
  std::atomic<int64_t> sum{0};
  parallel_for(1000, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 999 * 1000 / 2);
  EXPECT_GE(num_threads(), 1);
}

// User text echoed in messages stays valid UTF-8 on one line: invalid bytes and control characters
// are escaped, valid text (any script) passes unchanged.
TEST(Printable, EscapesInvalidUtf8AndControlCharacters) {
  EXPECT_EQ(wan::printable("a red fox"), "a red fox");
  EXPECT_EQ(wan::printable("\xe7\x8b\x90 \xf0\x9f\xa6\x8a"), "\xe7\x8b\x90 \xf0\x9f\xa6\x8a");  // 狐 🦊
  EXPECT_EQ(wan::printable("a\xff" "b"), "a\\xFFb");
  EXPECT_EQ(wan::printable("x\ny\tz\r\x01\x7f"), "x\\ny\\tz\\r\\x01\\x7F");
  EXPECT_EQ(wan::printable("\xc0\xaf"), "\\xC0\\xAF");                  // overlong
  EXPECT_EQ(wan::printable("\xed\xa0\x80"), "\\xED\\xA0\\x80");       // surrogate
  EXPECT_EQ(wan::printable("\xf4\x90\x80\x80"), "\\xF4\\x90\\x80\\x80");  // above U+10FFFF
  EXPECT_EQ(wan::printable("\xe4\xb8"), "\\xE4\\xB8");                  // truncated
  EXPECT_EQ(wan::printable("abcdef", 3), "abc...");
  EXPECT_EQ(wan::printable("abc", 3), "abc");
  EXPECT_EQ(wan::first_invalid_utf8("ok \xe7\x8b\x90"), std::string::npos);
  EXPECT_EQ(wan::first_invalid_utf8("ok\x80"), 2u);
  // Whatever the bytes, the result is valid UTF-8 without control characters.
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  const std::string p = wan::printable(all + all);
  EXPECT_EQ(wan::first_invalid_utf8(p), std::string::npos);
  for (char c : p) EXPECT_FALSE(static_cast<unsigned char>(c) < 0x20 || c == 0x7f);
}

TEST(Errors, ContextIsPrepended) {
  try {
    WAN_WITH_CONTEXT("loading x.safetensors", WAN_CHECK(1 == 2, "tensor 'a' has ", 3, " dims"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "loading x.safetensors: tensor 'a' has 3 dims");
    EXPECT_EQ(e.kind(), ErrorKind::BadInput);
  }
  try {
    WAN_ASSERT(false, "detail");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Internal);
    EXPECT_NE(std::string(e.what()).find("test_core.cpp"), std::string::npos);
  }
}
