// Test helper shared by the CPU and GPU GGUF DiT tests: one expert's tensors written as a GGUF DiT
// with every block type the engine dequantises (Q8_0 through the writer's quantiser, the others as
// random blocks with small f16 scales), and a safetensors twin holding their CPU dequantisation.
#pragma once
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/layout.h"
#include "core/dtype.h"
#include "formats/gguf_quant.h"
#include "formats/safetensors.h"
#include "testing/gguf_writer.h"

namespace wan::test {

// Bytes per block and where its f16 scales lie (offsets), for random blocks with small scales.
struct BlockLayout {
  GgmlType type;
  int bytes;
  std::vector<int> f16_scales;
};
inline const BlockLayout kQuant[] = {
    {GgmlType::Q4_0, 18, {0}},      {GgmlType::Q4_1, 20, {0, 2}}, {GgmlType::Q5_0, 22, {0}},
    {GgmlType::Q5_1, 24, {0, 2}},   {GgmlType::Q4_K, 144, {0, 2}}, {GgmlType::Q5_K, 176, {0, 2}},
    {GgmlType::Q6_K, 210, {208}},
};

inline std::string random_blocks(const BlockLayout& l, int64_t n_elements, std::mt19937& g) {
  const int64_t block = (l.type == GgmlType::Q4_K || l.type == GgmlType::Q5_K || l.type == GgmlType::Q6_K) ? 256 : 32;
  const int64_t nb = n_elements / block;
  std::string s(static_cast<size_t>(nb * l.bytes), '\0');
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.0005f, 0.004f);
  for (char& c : s) c = static_cast<char>(byte(g));
  for (int64_t b = 0; b < nb; ++b)
    for (int off : l.f16_scales) {
      const float v = scale(g);
      const uint16_t h = f32_to_f16(v);
      std::memcpy(&s[static_cast<size_t>(b * l.bytes + off)], &h, 2);
    }
  return s;
}

// Writes `store` (one expert) as a GGUF DiT and a safetensors twin of its dequantised values. GEMM
// weights cycle through the block types their rows allow; the rest alternate F32 / F16 / BF16.
inline void write_pair(const WeightStore& store, const std::string& gguf, const std::string& twin, uint32_t seed,
                std::vector<std::string>* types) {
  std::mt19937 g(seed);
  gen::GgufWriter w;
  std::vector<std::pair<std::string, Tensor>> plain;
  size_t k = 0, f = 0;
  for (const std::string& name : store.names()) {
    const Tensor x = store.get_f32(name);
    const Shape s = x.shape();
    const int64_t row = s[s.ndim - 1];
    Tensor deq = Tensor::f32(s);
    if (s.ndim == 2 && row % 32 == 0 && name.find("weight") != std::string::npos) {
      const BlockLayout* l = nullptr;
      for (size_t tries = 0; tries < 8 && !l; ++tries, ++k) {
        const BlockLayout& c = kQuant[k % std::size(kQuant)];
        const int64_t block = c.bytes == 144 || c.bytes == 176 || c.bytes == 210 ? 256 : 32;
        if (row % block == 0) l = &c;
      }
      if (k % 4 == 3 || !l) {  // Q8_0 through our quantiser (gguf-py's) from the real values
        const std::string q = gen::gguf_quantize(GgmlType::Q8_0, x.f32(), x.numel());
        gguf_dequantize(GgmlType::Q8_0, q.data(), x.numel(), deq.f32());
        w.add_raw(name, s, GgmlType::Q8_0, q);
        types->push_back("Q8_0");
      } else {
        const std::string q = random_blocks(*l, x.numel(), g);
        gguf_dequantize(l->type, q.data(), x.numel(), deq.f32());
        w.add_raw(name, s, l->type, q);
        types->push_back(ggml_type_name(l->type));
      }
    } else {
      const GgmlType t = (f++ % 3 == 0) ? GgmlType::F32 : (f % 3 == 1 ? GgmlType::F16 : GgmlType::BF16);
      const std::string q = gen::gguf_quantize(t, x.f32(), x.numel());
      gguf_dequantize(t, q.data(), x.numel(), deq.f32());
      w.add_raw(name, s, t, q);
    }
    plain.emplace_back(name, deq);
  }
  w.write(gguf);
  write_safetensors(twin, plain);
}

}  // namespace wan::test
