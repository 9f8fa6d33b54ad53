// The CPU fp32 merge of a LoraTarget and the WeightStore that serves merged weights (lora.h).
// Arithmetic order (shared with kernels/lora_merge.cu so CPU and GPU agree bit for bit): per element,
// delta starts at +0; for each low-rank term s = Σ_r up[o, r]·down[r, i] summed over r in increasing
// order, delta = delta + scale·s; then delta = delta + scale·diff for each full term; w = w + delta.
// Separate multiplies and adds (the build uses -ffp-contract=off). Zero-scale terms are skipped, and a
// weight with no other term is not written at all, so a zero strength gives the base bit for bit
// (w + 0 would turn -0 into +0).
#include <cmath>
#include <sstream>

#include "core/error.h"
#include "core/thread_pool.h"
#include "lora/lora.h"

namespace wan {

Tensor LoraLowRank::up_f32() const { return up.to_f32(); }
Tensor LoraLowRank::down_f32() const { return down.to_f32(); }
Tensor LoraFull::delta_f32() const { return delta.to_f32(); }

bool LoraTarget::active() const {
  for (const LoraLowRank& t : low_rank)
    if (t.scale != 0.0f) return true;
  for (const LoraFull& f : full)
    if (f.scale != 0.0f) return true;
  return false;
}

const LoraTarget* LoraSet::find(const std::string& name) const {
  auto it = targets.find(name);
  return it == targets.end() ? nullptr : &it->second;
}

std::vector<std::string> LoraSet::summary_lines(bool verbose) const {
  std::vector<std::string> out;
  for (const LoraFileSummary& f : files) {
    std::ostringstream os;
    os << "lora " << f.path << " (" << f.format << ", strength " << f.strength;
    if (f.expert != LoraExpert::All) os << ", " << lora_expert_name(f.expert) << "-noise expert";
    os << "): " << f.modules_matched() << " tensors changed, " << f.skipped.size() << " keys skipped";
    out.push_back(os.str());
    for (const std::string& n : f.notes) out.push_back("  note: " + n);
    if (!verbose) continue;
    for (const std::string& n : f.matched) out.push_back("  merged: " + n);
    for (const LoraSkip& s : f.skipped) out.push_back("  skipped: " + s.key + ": " + s.reason);
  }
  return out;
}

void apply_lora_cpu(const LoraTarget& t, Tensor& w) {
  WAN_CHECK(w.dtype() == DType::F32 && w.view().is_contiguous(), "LoRA merge of ", t.name, ": the weight must be contiguous f32");
  WAN_CHECK(w.shape() == t.shape, "LoRA merge of ", t.name, ": weight shape ", w.shape().str(), ", LoRA target ",
            t.shape.str());
  if (!t.active()) return;
  struct Lr {
    Tensor up, down;
    int64_t rank;
    float scale;
  };
  struct Full {
    Tensor d;
    float scale;
  };
  std::vector<Lr> lr;
  std::vector<Full> fu;
  for (const LoraLowRank& x : t.low_rank)
    if (x.scale != 0.0f) lr.push_back({x.up_f32(), x.down_f32(), x.rank(), x.scale});
  for (const LoraFull& x : t.full)
    if (x.scale != 0.0f) fu.push_back({x.delta_f32(), x.scale});
  const int64_t rows = t.rows, cols = t.cols;
  float* wp = w.f32();
  parallel_for(rows, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> delta(static_cast<size_t>(cols)), s(static_cast<size_t>(cols));
    for (int64_t o = r0; o < r1; ++o) {
      std::fill(delta.begin(), delta.end(), 0.0f);
      for (const Lr& term : lr) {
        const float* up = term.up.f32() + o * term.rank;
        const float* down = term.down.f32();
        std::fill(s.begin(), s.end(), 0.0f);
        for (int64_t r = 0; r < term.rank; ++r) {
          const float a = up[r];
          const float* d = down + r * cols;
          for (int64_t i = 0; i < cols; ++i) s[i] = s[i] + a * d[i];
        }
        for (int64_t i = 0; i < cols; ++i) delta[i] = delta[i] + term.scale * s[i];
      }
      for (const Full& f : fu) {
        const float* d = f.d.f32() + o * cols;
        for (int64_t i = 0; i < cols; ++i) delta[i] = delta[i] + f.scale * d[i];
      }
      float* row = wp + o * cols;
      for (int64_t i = 0; i < cols; ++i) row[i] = row[i] + delta[i];
    }
  });
}

namespace {

class LoraStore final : public WeightStore {
 public:
  LoraStore(std::unique_ptr<WeightStore> base, std::shared_ptr<const LoraSet> lora)
      : base_(std::move(base)), lora_(std::move(lora)) {
    WAN_ASSERT(base_ && lora_);
    for (const auto& [name, t] : lora_->targets) {
      WAN_CHECK(base_->contains(name), "LoRA: the checkpoint has no tensor ", name);
      WAN_CHECK(base_->shape(name) == t.shape, "LoRA: ", name, " is ", base_->shape(name).str(),
                " in the checkpoint but ", t.shape.str(), " in the LoRA's model");
    }
  }
  std::vector<std::string> names() const override { return base_->names(); }
  bool contains(const std::string& n) const override { return base_->contains(n); }
  Shape shape(const std::string& n) const override { return base_->shape(n); }
  DType dtype(const std::string& n) const override { return lora_->find(n) ? DType::F32 : base_->dtype(n); }
  Tensor get(const std::string& n) const override { return lora_->find(n) ? get_f32(n) : base_->get(n); }
  Tensor get_f32(const std::string& n) const override {
    const LoraTarget* t = lora_->find(n);
    if (!t) return base_->get_f32(n);
    Tensor w = base_->get_f32(n);
    // An f32 tensor may come back as a view of the read-only mapping: merge into a copy. Other dtypes
    // were converted into a fresh buffer that is ours to change.
    if (base_->dtype(n) == DType::F32 || !w.view().is_contiguous()) w = w.clone();
    apply_lora_cpu(*t, w);
    return w;
  }
  std::vector<std::string> unexpected() const override { return base_->unexpected(); }
  std::optional<RawSpan> raw_span(const std::string& n) const override {
    if (lora_->find(n)) return std::nullopt;
    return base_->raw_span(n);
  }

 private:
  std::unique_ptr<WeightStore> base_;
  std::shared_ptr<const LoraSet> lora_;
};

}  // namespace

std::unique_ptr<WeightStore> with_lora(std::unique_ptr<WeightStore> base, std::shared_ptr<const LoraSet> lora) {
  if (!lora || lora->empty()) return base;
  return std::make_unique<LoraStore>(std::move(base), std::move(lora));
}

}  // namespace wan
