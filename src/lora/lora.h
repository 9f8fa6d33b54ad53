// LoRA files for the DiT: reading every common key format (ComfyUI/official, kohya/musubi, diffusers/PEFT,
// DiffSynth, LyCORIS-named LoRA, full-delta .diff/.diff_b/diff_m) into per-target terms keyed by the
// official tensor name, the CPU fp32 merge, and a WeightStore that serves merged weights.
// Invariants: load_lora_set validates everything from the safetensors headers (names, dtypes, shapes,
// pairs, ranks) before returning, and every refusal is one wan::Error (BadInput) naming the file and the
// key. Factors stay as stored (borrowed from the file's mapping); they are widened to f32 only when
// applied. The merge computes each weight's delta first (terms in order, each inner sum over the rank in
// increasing order, no FMA) and adds it once, as kernels/lora_merge.h does on the GPU, so the two agree
// bit for bit; a weight whose terms all have scale 0 is left untouched (bitwise the base).
// Scales: low-rank ΔW = strength · alpha / rank · up @ down with alpha from the file (`.alpha`, PEFT
// metadata or adapter_config.json), else strength · up @ down (ComfyUI, LightX2V and diffusers agree);
// .diff / .diff_b / diff_m are added times strength; PEFT lora_B.bias is scaled like its pair (PEFT).
// Expert routing: a spec's expert (All / High / Low) picks the DiTs it applies to; inside a file that
// holds `transformer_2.` keys (diffusers Wan 2.2), `transformer.` keys go to the high-noise expert only
// and `transformer_2.` keys to the low-noise expert only.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/layout.h"
#include "core/tensor.h"
#include "models/weight_spec.h"

namespace wan {

enum class LoraExpert { All, High, Low };  // --lora, --lora-high, --lora-low
const char* lora_expert_name(LoraExpert e);  // "all", "high", "low"

struct LoraSpec {
  std::string path;
  float strength = 1.0f;
  LoraExpert expert = LoraExpert::All;
};
// "PATH[:SCALE]": split at the last ':' only when what follows parses fully as a finite float (paths
// may contain ':'). Throws wan::OptionError naming `option_name` (e.g. "lora") for an empty path.
LoraSpec parse_lora_arg(const std::string& text, LoraExpert expert, const std::string& option_name);

// delta = scale · up @ down, in the target's GEMM form [rows, cols].
struct LoraLowRank {
  Tensor up;    // [rows, rank] as stored (f32, bf16 or f16); a conv's [out, r, 1, 1, 1] viewed as 2-D
  Tensor down;  // [rank, cols] as stored; a conv's [r, C, kt, kh, kw] viewed as [r, C·kt·kh·kw]
  float scale = 1.0f;  // strength · alpha / rank, or strength when the file has no alpha
  std::string source;  // "<file>: <up key>" for messages
  int64_t rank() const { return down.dim(0); }
  Tensor up_f32() const;    // [rows, rank] f32 (shared when stored f32)
  Tensor down_f32() const;  // [rank, cols] f32
};
// delta = scale · diff, a full tensor of the target's size.
struct LoraFull {
  Tensor delta;  // [rows, cols] as stored (f32, bf16 or f16)
  float scale = 1.0f;
  std::string source;
  Tensor delta_f32() const;  // [rows, cols] f32
};

// Every term on one tensor of the DiT.
struct LoraTarget {
  std::string name;  // official tensor name ("blocks.3.self_attn.q.weight", "blocks.3.modulation")
  Shape shape;       // the tensor's shape in the DiT's weight table
  int64_t rows = 0, cols = 0;  // GEMM form: rows = shape[0] (1 for a 1-D tensor or a modulation table)
  std::vector<LoraLowRank> low_rank;  // in the order of the specs, then of the files' keys
  std::vector<LoraFull> full;
  bool active() const;  // any term with a nonzero scale
};

struct LoraSkip {
  std::string key;
  std::string reason;
};
// What one file contributed to one DiT.
struct LoraFileSummary {
  std::string path;
  float strength = 1.0f;
  LoraExpert expert = LoraExpert::All;
  std::string format;  // "official", "kohya", "kohya-wan-fun", "peft", "diffsynth", "lycoris-lora", or "a+b" mixed
  std::vector<std::string> matched;  // official names of the tensors it changes, sorted (for --verbose)
  std::vector<LoraSkip> skipped;     // keys not applied, with the reason
  std::vector<std::string> notes;    // remarks: Wan 2.1 I2V keys, where alpha came from, routing
  size_t modules_matched() const { return matched.size(); }
};

struct LoraSet {
  std::map<std::string, LoraTarget> targets;  // official name -> terms
  std::vector<LoraFileSummary> files;         // one per spec applied to this DiT, in order
  const LoraTarget* find(const std::string& official_name) const;  // nullptr: not targeted
  bool empty() const { return targets.empty(); }
  // One line per file ("lora <path> (<format>, strength s): n tensors, k keys skipped") and, verbose,
  // the matched names and each skipped key with its reason.
  std::vector<std::string> summary_lines(bool verbose) const;
};

// The terms of every spec whose expert is All or `which` for one DiT of weight table `dit_table`.
// `which`: High or Low for an A14B expert, All for a single-model task (a spec for High / Low is then
// an error). Reads headers only (and the `.alpha` scalars); throws wan::Error (BadInput) naming the
// file and key for: not safetensors, LoHa / LoKr / LoCon-mid / DoRA keys, an up without its down (or
// the reverse), up and down of different ranks, a shape that disagrees with its target, a non-float
// dtype, or a file none of whose keys names a tensor of this DiT.
LoraSet load_lora_set(const std::vector<LoraSpec>& specs, LoraExpert which, const WeightTable& dit_table);

// w (f32, contiguous, t.shape) += Σ scale·(up @ down) + Σ scale·diff, skipping zero-scale terms; the
// delta is summed first and added once (the GPU merge's order).
void apply_lora_cpu(const LoraTarget& t, Tensor& w_f32);

// A store whose get / get_f32 return the merged f32 weight for targeted names (dtype() says F32 for
// them) and whose raw_span is nullopt for them (streaming loaders then fall back to get); other names
// pass through. Throws wan::Error when a target is missing from `base` or has another shape.
std::unique_ptr<WeightStore> with_lora(std::unique_ptr<WeightStore> base, std::shared_ptr<const LoraSet> lora);

}  // namespace wan
