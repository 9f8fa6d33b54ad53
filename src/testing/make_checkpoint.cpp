// `wan make-checkpoint`: random-weight checkpoints in the official and diffusers layouts.
// Layouts (spec §3.1, §3.3):
//   official  A14B: high_noise_model/ low_noise_model/ {config.json, diffusion_pytorch_model*.safetensors}
//             TI2V: config.json + diffusion_pytorch_model*.safetensors at the root
//             all:  models_t5_umt5-xxl-enc-bf16.pth, Wan2.1_VAE.pth | Wan2.2_VAE.pth, google/umt5-xxl/
//   diffusers model_index.json, transformer/ (+ transformer_2/ for A14B, the low-noise expert),
//             text_encoder/, tokenizer/, vae/, scheduler/
//   comfyui   diffusion_models/wan2.2_{t2v,i2v}_{high,low}_noise_14B_<dt>.safetensors | wan2.2_ti2v_5B_<dt>,
//             text_encoders/umt5_xxl_fp16 | umt5_xxl_fp8_e4m3fn_scaled, vae/wan_2.1_vae | wan2.2_vae,
//             tokenizer/ (ComfyUI ships none): official DiT and VAE names, HF UMT5 names ("shared.weight")
#include "testing/make_checkpoint.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <system_error>
#include <unordered_map>

#include "ckpt/names.h"
#include "core/error.h"
#include "core/log.h"
#include "models/dit/weights.h"
#include "models/umt5/weights.h"
#include "models/vae/weights.h"
#include "models/weight_spec.h"
#include "testing/hf_configs.h"
#include "testing/text_files.h"
#include "testing/tokenizer_files.h"
#include "formats/pth.h"
#include "formats/safetensors.h"

namespace wan::gen {
namespace {

namespace fs = std::filesystem;

// ---- tensors under output names ----------------------------------------------------------------

using NameMap = std::function<std::string(const std::string&)>;

struct Renamed {
  std::vector<TensorSpec> specs;
  std::unordered_map<std::string, size_t> param_of;  // output name -> index into the weight table
};

Renamed rename(const WeightTable& ps, DType dtype, const NameMap& map) {
  Renamed r;
  r.specs.reserve(ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    std::string out = map ? map(ps[i].name) : ps[i].name;
    WAN_ASSERT(!out.empty(), "no output name for tensor ", ps[i].name);
    WAN_ASSERT(r.param_of.emplace(out, i).second, "two tensors named ", out);
    r.specs.push_back({out, dtype, ps[i].shape});
  }
  return r;
}

TensorFill make_fill(const WeightTable& ps, const Renamed& r, uint64_t seed) {
  return [&ps, &r, seed](const TensorSpec& spec, void* dst) {
    auto it = r.param_of.find(spec.name);
    WAN_ASSERT(it != r.param_of.end(), "unknown tensor ", spec.name);
    fill_init(ps[it->second], seed, spec.dtype, dst);
  };
}

// ---- components -------------------------------------------------------------------------------

void make_dir(const fs::path& d) {
  std::error_code ec;
  fs::create_directories(d, ec);
  WAN_CHECK(!ec, d.string(), ": cannot create folder: ", ec.message());
}

void write_dit(const fs::path& dir, const DiTConfig& cfg, Layout layout, DType dtype, uint64_t seed,
               uint64_t shard_bytes) {
  make_dir(dir);
  const bool official = layout == Layout::Official;
  write_text_file((dir / "config.json").string(),
                  official ? dit_config_to_official_json(cfg) : dit_config_to_diffusers_json(cfg));
  cfg.validate();
  const WeightTable ps = dit_weight_table(cfg);
  const Renamed r = rename(ps, dtype, official ? NameMap() : NameMap(dit_official_to_diffusers));
  write_safetensors_sharded(dir.string(), "diffusion_pytorch_model", r.specs, make_fill(ps, r, seed), shard_bytes);
}

void write_t5(const fs::path& root, const T5Config& cfg, Layout layout, uint64_t seed, uint64_t shard_bytes) {
  const WeightTable ps = umt5_weight_table(cfg);
  if (layout == Layout::Official) {
    const Renamed r = rename(ps, DType::BF16, nullptr);
    write_pth((root / "models_t5_umt5-xxl-enc-bf16.pth").string(), r.specs, make_fill(ps, r, seed));
    return;
  }
  const fs::path dir = root / "text_encoder";
  make_dir(dir);
  write_text_file((dir / "config.json").string(), t5_config_hf_json(cfg));
  const Renamed r = rename(ps, DType::BF16, t5_official_to_hf);
  write_safetensors_sharded(dir.string(), "model", r.specs, make_fill(ps, r, seed), shard_bytes);
}

void write_vae(const fs::path& root, const VaeConfig& cfg, Layout layout, uint64_t seed, uint64_t shard_bytes) {
  const WeightTable ps = vae_weight_table(cfg);
  if (layout == Layout::Official) {
    const Renamed r = rename(ps, DType::F32, nullptr);
    const char* file = cfg.version == 22 ? "Wan2.2_VAE.pth" : "Wan2.1_VAE.pth";
    write_pth((root / file).string(), r.specs, make_fill(ps, r, seed));
    return;
  }
  const fs::path dir = root / "vae";
  make_dir(dir);
  write_text_file((dir / "config.json").string(), vae_config_diffusers_json(cfg));
  const int version = cfg.version;
  const Renamed r =
      rename(ps, DType::F32, [version](const std::string& n) { return vae_official_to_diffusers(n, version); });
  write_safetensors_sharded(dir.string(), "diffusion_pytorch_model", r.specs, make_fill(ps, r, seed), shard_bytes);
}

void write_all(const fs::path& root, const ModelPreset& plan, const MakeCheckpointOptions& o) {
  const bool official = o.layout == Layout::Official;
  const bool experts = plan.task != Task::TI2V_5B;
  if (experts) {
    LOG_INFO("make-checkpoint: high-noise expert (", plan.dit.num_layers, " layers)");
    write_dit(root / (official ? "high_noise_model" : "transformer"), plan.dit, o.layout, o.dtype,
              dit_seed(o.seed, plan.task, true), o.max_shard_bytes);
    if (o.dit_only) return;
    LOG_INFO("make-checkpoint: low-noise expert");
    write_dit(root / (official ? "low_noise_model" : "transformer_2"), plan.dit, o.layout, o.dtype,
              dit_seed(o.seed, plan.task, false), o.max_shard_bytes);
  } else {
    LOG_INFO("make-checkpoint: DiT (", plan.dit.num_layers, " layers)");
    write_dit(official ? root : root / "transformer", plan.dit, o.layout, o.dtype, dit_seed(o.seed, plan.task, true),
              o.max_shard_bytes);
    if (o.dit_only) return;
  }
  LOG_INFO("make-checkpoint: text encoder");
  write_t5(root, plan.t5, o.layout, component_seed(o.seed, "t5"), o.max_shard_bytes);
  LOG_INFO("make-checkpoint: VAE ", plan.vae.version == 22 ? "2.2" : "2.1");
  write_vae(root, plan.vae, o.layout, component_seed(o.seed, "vae"), o.max_shard_bytes);

  const fs::path tok = official ? root / "google" / "umt5-xxl" : root / "tokenizer";
  make_dir(tok);
  write_tokenizer_dir(tok.string());
  if (!official) {
    write_text_file((root / "model_index.json").string(), model_index_json(plan.task));
    make_dir(root / "scheduler");
    write_text_file((root / "scheduler" / "scheduler_config.json").string(), scheduler_config_json(plan.task));
  }
}

// ---- ComfyUI component files --------------------------------------------------------------------

// fp8_scaled stores the GEMM weights of the blocks as fp8 (ComfyUI's scaled_fp8_ops quantise Linear
// layers only); embeddings, norms, modulations and convolutions keep the file's dtype.
bool fp8_quantised(const WeightSpec& w) {
  return w.cls == WeightClass::GemmWeight && w.shape.ndim == 2 && w.name.rfind("blocks.", 0) == 0;
}
// A per-tensor scale from the init rule's bound (no second pass over the values): |w| <= bound maps into
// fp8 e4m3's +-448. ComfyUI's converters use the tensor's amax; any positive f32 scale is valid.
float fp8_scale_for(const InitRule& r) {
  const float bound = r.kind == InitKind::Uniform ? r.scale
                      : r.kind == InitKind::Normal ? 3.47f * r.scale
                                                   : 1.0f + 3.47f * r.scale;
  return bound > 0.f ? bound / 448.0f : 1.0f;
}

// One file of a weight table under ComfyUI names (map: official -> file name; null = official).
// fp8: quantised rows as F8E4M3 + "<layer>.scale_weight" (f32 scalar), and the "scaled_fp8" marker.
void write_comfy_file(const fs::path& file, const WeightTable& ps, uint64_t seed, DType dtype, bool fp8,
                      const NameMap& map) {
  enum Kind { Value, Quant, Scale, Marker };
  struct Item {
    size_t row;
    Kind kind;
  };
  std::vector<TensorSpec> specs;
  std::unordered_map<std::string, Item> items;
  auto add = [&](TensorSpec spec, size_t row, Kind kind) {
    WAN_ASSERT(items.emplace(spec.name, Item{row, kind}).second, "two tensors named ", spec.name);
    specs.push_back(std::move(spec));
  };
  for (size_t i = 0; i < ps.size(); ++i) {
    const std::string out = map ? map(ps[i].name) : ps[i].name;
    WAN_ASSERT(!out.empty(), "no output name for tensor ", ps[i].name);
    if (fp8 && fp8_quantised(ps[i])) {
      add({out, DType::F8E4M3, ps[i].shape}, i, Quant);
      add({out.substr(0, out.size() - 7) + ".scale_weight", DType::F32, Shape{}}, i, Scale);  // strip ".weight"
    } else {
      add({out, dtype, ps[i].shape}, i, Value);
    }
  }
  if (fp8) add({"scaled_fp8", DType::F8E4M3, Shape{0}}, 0, Marker);
  // Largest elements first: every tensor stays aligned for its type (formats/safetensors.h).
  std::stable_sort(specs.begin(), specs.end(),
                   [](const TensorSpec& a, const TensorSpec& b) { return dtype_size(a.dtype) > dtype_size(b.dtype); });
  TensorFill fill = [&](const TensorSpec& spec, void* dst) {
    const Item& it = items.at(spec.name);
    const WeightSpec& w = ps[it.row];
    if (it.kind == Value) return fill_init(w, seed, spec.dtype, dst);
    if (it.kind == Marker) return;
    const float scale = fp8_scale_for(w.init);
    if (it.kind == Scale) {
      *static_cast<float*>(dst) = scale;
      return;
    }
    std::vector<float> v(static_cast<size_t>(w.shape.numel()));
    fill_init(w, seed, DType::F32, v.data());
    auto* q = static_cast<uint8_t*>(dst);
    for (size_t k = 0; k < v.size(); ++k) q[k] = f32_to_f8e4m3(v[k] / scale);
  };
  write_safetensors(file.string(), specs, fill);
}

const char* comfy_suffix(DType d) {
  switch (d) {
    case DType::F16: return "fp16";
    case DType::BF16: return "bf16";
    case DType::F32: return "fp32";
    case DType::F8E4M3: return "fp8_scaled";
    default: break;
  }
  WAN_THROW("--dtype ", dtype_name(d), ": ComfyUI files are fp16, bf16, fp32 or fp8_scaled");
}

void write_comfyui(const fs::path& root, const ModelPreset& plan, const MakeCheckpointOptions& o) {
  const ComfyUIFiles f = comfyui_files(o.config, o.dtype);
  const bool fp8 = o.dtype == DType::F8E4M3;
  const DType dt = fp8 ? DType::F16 : o.dtype;
  make_dir(root / "diffusion_models");
  const WeightTable dit = dit_weight_table(plan.dit);
  if (plan.task == Task::TI2V_5B) {
    LOG_INFO("make-checkpoint: DiT (", plan.dit.num_layers, " layers)");
    write_comfy_file(root / f.dit, dit, dit_seed(o.seed, plan.task, true), dt, fp8, nullptr);
  } else {
    LOG_INFO("make-checkpoint: high-noise expert (", plan.dit.num_layers, " layers)");
    write_comfy_file(root / f.dit_high, dit, dit_seed(o.seed, plan.task, true), dt, fp8, nullptr);
    if (o.dit_only) return;
    LOG_INFO("make-checkpoint: low-noise expert");
    write_comfy_file(root / f.dit_low, dit, dit_seed(o.seed, plan.task, false), dt, fp8, nullptr);
  }
  if (o.dit_only) return;
  LOG_INFO("make-checkpoint: text encoder");
  make_dir(root / "text_encoders");
  write_comfy_file(root / f.text_encoder, umt5_weight_table(plan.t5), component_seed(o.seed, "t5"), DType::F16, fp8,
                   t5_official_to_hf);
  LOG_INFO("make-checkpoint: VAE ", plan.vae.version == 22 ? "2.2" : "2.1");
  make_dir(root / "vae");
  write_comfy_file(root / f.vae, vae_weight_table(plan.vae), component_seed(o.seed, "vae"), DType::F16, false, nullptr);
  make_dir(root / f.tokenizer);
  write_tokenizer_dir((root / f.tokenizer).string());
}

// ---- output folder ----------------------------------------------------------------------------

bool is_empty_dir(const fs::path& p) {
  std::error_code ec;
  auto it = fs::directory_iterator(p, ec);
  WAN_CHECK(!ec, p.string(), ": cannot read folder: ", ec.message());
  return it == fs::directory_iterator();
}

// A fresh folder "<base>.<tag>-XXXXXX" next to base (same file system, so rename is atomic).
fs::path make_unique_dir(const fs::path& base, const char* tag) {
  std::string templ = base.string() + "." + tag + "-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  WAN_CHECK(::mkdtemp(buf.data()) != nullptr, templ, ": cannot create folder: ", std::strerror(errno));
  fs::path p(buf.data());
  // mkdtemp makes the folder private (0700); a checkpoint is an ordinary folder.
  ::chmod(p.c_str(), 0755);
  return p;
}

void remove_tree(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
  if (ec) LOG_WARN("cannot remove ", p.string(), ": ", ec.message());
}

// Moves the finished partial folder to out, replacing an empty (or, with force, any) folder there.
void install(const fs::path& partial, const fs::path& out, bool force) {
  std::error_code ec;
  fs::path old;
  if (fs::exists(fs::symlink_status(out))) {
    if (is_empty_dir(out)) {
      fs::remove(out, ec);
      WAN_CHECK(!ec, out.string(), ": cannot replace the empty folder: ", ec.message());
    } else {
      WAN_ASSERT(force, "non-empty output without --force");
      old = make_unique_dir(out, "old");
      fs::remove(old, ec);  // rename needs the target name free
      fs::rename(out, old, ec);
      WAN_CHECK(!ec, out.string(), ": cannot move the old folder aside: ", ec.message());
    }
  }
  fs::rename(partial, out, ec);
  if (ec) {
    if (!old.empty()) {
      std::error_code ec2;
      fs::rename(old, out, ec2);  // put the previous checkpoint back
    }
    WAN_THROW(out.string(), ": cannot move the finished checkpoint into place: ", ec.message());
  }
  if (!old.empty()) remove_tree(old);
}

}  // namespace

ComfyUIFiles comfyui_files(const std::string& config, DType dtype) {
  const Task task = model_preset(config, 0).task;
  const std::string sfx = comfy_suffix(dtype);
  const bool fp8 = dtype == DType::F8E4M3;
  ComfyUIFiles f;
  const std::string d = "diffusion_models/wan2.2_";
  if (task == Task::TI2V_5B) {
    f.dit = d + "ti2v_5B_" + sfx + ".safetensors";
  } else {
    const std::string t = task == Task::I2V_A14B ? "i2v" : "t2v";
    f.dit_high = d + t + "_high_noise_14B_" + sfx + ".safetensors";
    f.dit_low = d + t + "_low_noise_14B_" + sfx + ".safetensors";
  }
  f.text_encoder = fp8 ? "text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors" : "text_encoders/umt5_xxl_fp16.safetensors";
  f.vae = task == Task::TI2V_5B ? "vae/wan2.2_vae.safetensors" : "vae/wan_2.1_vae.safetensors";
  f.tokenizer = "tokenizer";
  return f;
}

MakeCheckpointResult make_checkpoint(const MakeCheckpointOptions& o) {
  const ModelPreset plan = model_preset(o.config, o.layers);
  WAN_CHECK(o.layout == Layout::Official || o.layout == Layout::Diffusers || o.layout == Layout::ComfyUI,
            "make-checkpoint writes the official, the diffusers or the comfyui layout");
  if (o.layout == Layout::ComfyUI)
    WAN_CHECK(o.dtype == DType::F16 || o.dtype == DType::BF16 || o.dtype == DType::F32 || o.dtype == DType::F8E4M3,
              "--dtype must be fp16, bf16, fp32 or fp8_scaled for the comfyui layout");
  else
    WAN_CHECK(o.dtype == DType::F32 || o.dtype == DType::BF16, "--dtype must be fp32 or bf16");
  WAN_CHECK(!o.out.empty(), "missing output folder (--out)");
  WAN_CHECK(o.max_shard_bytes > 0, "shard size must be positive");

  fs::path out = fs::path(o.out).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();  // "dir/" -> "dir"
  WAN_CHECK(!out.empty() && out.filename() != "." && out.filename() != "..", o.out, ": not a usable output folder");
  fs::path parent = out.parent_path();
  if (parent.empty()) parent = ".";
  make_dir(parent);
  {
    std::error_code ec;
    auto st = fs::symlink_status(out, ec);
    if (fs::exists(st)) {
      WAN_CHECK(fs::is_directory(st), out.string(), ": exists and is not a folder");
      WAN_CHECK(o.force || is_empty_dir(out), out.string(), ": exists and is not empty (use --force to replace it)");
    }
  }

  const fs::path partial = make_unique_dir(out, "partial");
  try {
    if (o.layout == Layout::ComfyUI) write_comfyui(partial, plan, o);
    else write_all(partial, plan, o);
    install(partial, out, o.force);
  } catch (...) {
    remove_tree(partial);
    throw;
  }

  MakeCheckpointResult res;
  res.root = out.string();
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(out, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (!it->is_regular_file()) continue;
    res.files.push_back(fs::relative(it->path(), out).string());
    res.bytes += it->file_size();
  }
  std::sort(res.files.begin(), res.files.end());
  return res;
}

}  // namespace wan::gen
