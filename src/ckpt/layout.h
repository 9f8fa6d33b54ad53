// Checkpoint layouts: detection of the layout and task of a file or folder, the components it holds,
// and a weight store per component that serves tensors under the internal (official) names.
// Layouts (spec §3): official release folder (high_noise_model/, low_noise_model/ or a root DiT,
// models_t5_umt5-xxl-enc-bf16.pth, Wan2.1_VAE.pth | Wan2.2_VAE.pth, google/umt5-xxl/), diffusers
// folder (model_index.json, transformer/, transformer_2/, text_encoder/, vae/, tokenizer/), and a
// ComfyUI single DiT file (official names, optional "model.diffusion_model." prefix, fp16/bf16 or
// fp8_scaled with "<layer>.scale_weight"), and ComfyUI component files named one by one
// (detect_components: DiT expert(s), UMT5 text encoder, VAE, tokenizer; ckpt/components.cpp).
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/config.h"
#include "models/dit/weights.h"  // dit_expected_shapes: what a DiT of a config must hold

namespace wan {

enum class Layout { Official, Diffusers, ComfyUI };
const char* layout_name(Layout l);  // "official", "diffusers", "comfyui"

enum class Role { DiT, DiTHigh, DiTLow, TextEncoder, Vae, Tokenizer };
const char* role_name(Role r);  // "dit", "dit_high_noise", "dit_low_noise", "text_encoder", "vae", "tokenizer"

struct Component {
  Role role;
  std::string path;  // file or folder
};

struct CheckpointInfo {
  std::string root;
  Layout layout = Layout::Official;
  Task task = Task::T2V_A14B;
  bool task_certain = true;  // false when the task was guessed (e.g. a lone ComfyUI file)
  std::vector<Component> components;
  DiTConfig dit;              // config of the DiT expert(s) (both experts must agree)
  bool dit_config_from_file = true;  // false: inferred from tensor shapes (no config.json)
  std::string dit_prefix;     // ComfyUI: key prefix of the DiT tensors ("" or "model.diffusion_model.")
  bool fp8_scaled = false;    // ComfyUI fp8_scaled: fp8 weights with "<layer>.scale_weight" companions
  bool gguf = false;          // the DiT file(s) are GGUF (ckpt/gguf_store.h), possibly block-quantised
  int vae_version = 21;       // 21 (Wan2.1_VAE, A14B) or 22 (Wan2.2_VAE, TI2V-5B)
  // Layout::ComfyUI component files (detect_components): how the text encoder's and the VAE's
  // safetensors name their tensors. Unused by the folder layouts.
  struct FileNaming {
    std::string prefix;       // key prefix stripped before mapping ("" in the Comfy-Org files)
    bool official = false;    // official names (ComfyUI's VAE) instead of HF / diffusers names
    bool fp8_scaled = false;  // fp8 weights with "<layer>.scale_weight" companions
  };
  FileNaming t5_naming, vae_naming;
  std::vector<std::string> notes;  // human-readable remarks (why the task is uncertain, ...)
  const Component* find(Role r) const;
  bool has(Role r) const { return find(r) != nullptr; }
};

// "dim 5120 vs 3072, in_dim 16 vs 36" ("" when a == b).
std::string dit_config_diff(const DiTConfig& a, const DiTConfig& b);

// Throws wan::Error with one clear line when the path is missing or no layout matches.
CheckpointInfo detect_checkpoint(const std::string& path);

// Separate ComfyUI model files, as ComfyUI's models/ folders keep them. Empty = not given.
struct ComponentFiles {
  std::string dit;           // TI2V-5B, or one A14B expert run alone (--dit)
  std::string dit_high;      // A14B high-noise expert (--dit-high); needs dit_low
  std::string dit_low;       // A14B low-noise expert (--dit-low); needs dit_high
  std::string text_encoder;  // umt5_xxl_fp16 / umt5_xxl_fp8_e4m3fn_scaled .safetensors (--text-encoder)
  std::string vae;           // wan_2.1_vae / wan2.2_vae .safetensors (--vae)
  std::string tokenizer;     // folder with spiece.model, or the .model file (--tokenizer); needed with a text encoder
};
// Layout::ComfyUI checkpoint of the given files, from their safetensors headers only: each file's
// role is checked against its tensors, the DiT config inferred from shapes (experts must agree), the
// task from in_dim (16 t2v, 36 i2v, 48 ti2v; task_hint must agree), the VAE version from its tensors
// (2.1 for A14B, 2.2 for TI2V-5B), the encoder's width against the DiT's text_dim. root is the
// (high-noise) DiT file. Every problem is one wan::Error naming the option, the file and the problem.
CheckpointInfo detect_components(const ComponentFiles& files, std::optional<Task> task_hint = std::nullopt);

// Where the stored bytes of one tensor lie in its file, for streaming loaders that read the file
// themselves (ckpt/stream.h) instead of going through get(). The bytes are the tensor as stored
// (dtype, contiguous row-major shape); get_f32() equals converting them to f32 and, when scaled,
// multiplying each element by `scale` in f32 (fp8_scaled: W = W_fp8 * scale_weight).
struct RawSpan {
  std::string path;     // file holding the bytes
  uint64_t offset = 0;  // absolute byte offset in the file
  uint64_t length = 0;  // bytes = numel * dtype_size(dtype)
  DType dtype = DType::F32;
  Shape shape;
  bool scaled = false;  // fp8_scaled: multiply by scale after conversion to f32
  float scale = 1.0f;
  // Non-zero: a GGUF block-quantised tensor of this ggml type id (formats/gguf_quant.h GgmlType); dtype is
  // then U8 and length the stored bytes; get_f32() equals its dequantisation (gguf_dequantize).
  uint32_t ggml_type = 0;
};

// Tensors of one component under internal names. Dequantises fp8_scaled (W = W_fp8 * scale_weight)
// and converts any float dtype to f32 on get_f32().
class WeightStore {
 public:
  virtual ~WeightStore() = default;
  virtual std::vector<std::string> names() const = 0;  // internal names, sorted
  virtual bool contains(const std::string& name) const = 0;
  virtual Shape shape(const std::string& name) const = 0;
  virtual DType dtype(const std::string& name) const = 0;      // stored dtype
  virtual Tensor get(const std::string& name) const = 0;       // as stored (zero-copy when possible)
  virtual Tensor get_f32(const std::string& name) const = 0;   // converted (and dequantised) to f32
  // Source names that map to no internal name (reported by inspect).
  virtual std::vector<std::string> unexpected() const = 0;
  // The tensor's bytes in its file, or nullopt when they are not one contiguous range there (a
  // strided .pth tensor; a store that is not file-backed): such tensors must be read with get().
  // Throws like get() for an unknown name.
  virtual std::optional<RawSpan> raw_span(const std::string& name) const {
    (void)shape(name);
    return std::nullopt;
  }
};
std::unique_ptr<WeightStore> open_weights(const CheckpointInfo& info, Role role);

// The DiT roles, in the order a pipeline uses them (high-noise expert first).
bool role_is_dit(Role r);

}  // namespace wan
