// Tests of the DiT name mapping (spec §3.3): every official tensor name of a 2-block model maps to
// the diffusers name of the spec table and back; the norm2/norm3 swap; non-DiT names give "".
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "ckpt/names.h"

namespace wan {
namespace {

std::vector<std::string> official_names(int layers) {
  std::vector<std::string> n = {"patch_embedding.weight",  "patch_embedding.bias",    "text_embedding.0.weight",
                                "text_embedding.0.bias",   "text_embedding.2.weight", "text_embedding.2.bias",
                                "time_embedding.0.weight", "time_embedding.0.bias",   "time_embedding.2.weight",
                                "time_embedding.2.bias",   "time_projection.1.weight", "time_projection.1.bias",
                                "head.modulation",         "head.head.weight",        "head.head.bias"};
  for (int i = 0; i < layers; ++i) {
    std::string b = "blocks." + std::to_string(i) + ".";
    n.push_back(b + "modulation");
    for (const char* a : {"self_attn.", "cross_attn."}) {
      for (const char* p : {"q", "k", "v", "o"}) {
        n.push_back(b + a + p + ".weight");
        n.push_back(b + a + p + ".bias");
      }
      n.push_back(b + a + "norm_q.weight");
      n.push_back(b + a + "norm_k.weight");
    }
    for (const char* p : {"norm3.weight", "norm3.bias", "ffn.0.weight", "ffn.0.bias", "ffn.2.weight", "ffn.2.bias"})
      n.push_back(b + p);
  }
  return n;
}

TEST(Names, EveryDiTNameRoundTrips) {
  auto names = official_names(2);
  ASSERT_EQ(names.size(), 15u + 2 * 27u);
  std::set<std::string> diffusers;
  for (const auto& o : names) {
    std::string d = dit_official_to_diffusers(o);
    ASSERT_FALSE(d.empty()) << o;
    EXPECT_EQ(dit_diffusers_to_official(d), o) << o << " -> " << d;
    diffusers.insert(d);
  }
  EXPECT_EQ(diffusers.size(), names.size());  // injective
  // No official name survives unchanged except the patch embedding (names must really be translated).
  for (const auto& o : names) {
    if (o.rfind("patch_embedding", 0) != 0) {
      EXPECT_EQ(diffusers.count(o), 0u) << o;
    }
  }
}

TEST(Names, SpecTable) {
  const std::pair<const char*, const char*> cases[] = {
      {"time_embedding.0.weight", "condition_embedder.time_embedder.linear_1.weight"},
      {"time_embedding.2.bias", "condition_embedder.time_embedder.linear_2.bias"},
      {"text_embedding.0.weight", "condition_embedder.text_embedder.linear_1.weight"},
      {"text_embedding.2.weight", "condition_embedder.text_embedder.linear_2.weight"},
      {"time_projection.1.weight", "condition_embedder.time_proj.weight"},
      {"head.modulation", "scale_shift_table"},
      {"head.head.weight", "proj_out.weight"},
      {"head.head.bias", "proj_out.bias"},
      {"patch_embedding.weight", "patch_embedding.weight"},
      {"blocks.0.modulation", "blocks.0.scale_shift_table"},
      {"blocks.39.ffn.0.weight", "blocks.39.ffn.net.0.proj.weight"},
      {"blocks.1.ffn.2.bias", "blocks.1.ffn.net.2.bias"},
      {"blocks.7.norm3.weight", "blocks.7.norm2.weight"},
      {"blocks.7.norm3.bias", "blocks.7.norm2.bias"},
      {"blocks.7.norm2.weight", "blocks.7.norm3.weight"},
      {"blocks.3.self_attn.q.weight", "blocks.3.attn1.to_q.weight"},
      {"blocks.3.self_attn.k.bias", "blocks.3.attn1.to_k.bias"},
      {"blocks.3.self_attn.v.weight", "blocks.3.attn1.to_v.weight"},
      {"blocks.3.self_attn.o.weight", "blocks.3.attn1.to_out.0.weight"},
      {"blocks.3.self_attn.norm_q.weight", "blocks.3.attn1.norm_q.weight"},
      {"blocks.3.cross_attn.norm_k.weight", "blocks.3.attn2.norm_k.weight"},
      {"blocks.12.cross_attn.o.bias", "blocks.12.attn2.to_out.0.bias"},
      {"blocks.12.cross_attn.v.weight", "blocks.12.attn2.to_v.weight"},
  };
  for (const auto& [o, d] : cases) {
    EXPECT_EQ(dit_official_to_diffusers(o), d) << o;
    EXPECT_EQ(dit_diffusers_to_official(d), o) << d;
  }
}

TEST(Names, UnknownNamesGiveEmpty) {
  const char* not_official[] = {
      "",
      "blocks",
      "blocks.0",
      "blocks.0.",
      "blocks.x.modulation",
      "blocks.-1.modulation",
      "blocks.01.modulation",
      "blocks.0.modulation.weight",
      "blocks.0.self_attn.q",
      "blocks.0.self_attn.q.weightx",
      "blocks.0.self_attn.qq.weight",
      "blocks.0.attn1.to_q.weight",  // a diffusers name is not an official one
      "blocks.0.norm1.weight",
      "blocks.0.ffn.1.weight",
      "head.norm.weight",
      "head.modulation.weight",
      "freqs",
      "model.diffusion_model.patch_embedding.weight",
      "img_emb.proj.0.weight",
      "encoder.block.0.layer.0.SelfAttention.q.weight",
      "decoder.conv1.weight",
      "scaled_fp8",
      "blocks.0.self_attn.q.scale_weight",
      "patch_embedding.weight.extra",
  };
  for (const char* n : not_official) EXPECT_EQ(dit_official_to_diffusers(n), "") << n;
  const char* not_diffusers[] = {
      "",
      "blocks.0.self_attn.q.weight",  // an official name is not a diffusers one
      "blocks.0.modulation",
      "blocks.0.attn1.to_out.1.weight",
      "blocks.0.attn1.to_q",
      "condition_embedder.image_embedder.ff.net.0.proj.weight",
      "condition_embedder.time_embedder.linear_3.weight",
      "blocks.0.attn2.add_k_proj.weight",
      "blocks.0.norm1.weight",
      "rope.freqs",
      "scale_shift_table.weight",
      "proj_out",
      "text_encoder.shared.weight",
      "head.head.weight",
  };
  for (const char* n : not_diffusers) EXPECT_EQ(dit_diffusers_to_official(n), "") << n;
}

}  // namespace
}  // namespace wan
