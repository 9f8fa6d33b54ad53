// The pipeline's own files: prompt embeddings, latents, and all-or-nothing output handling.
//
// Invariants: readers validate before returning (tensor present, rank, non-empty, all values
// finite) and throw one-line wan::Error naming the file; writers write "<path>.tmp" and rename, so
// a file is either complete or absent.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace wan {

// File formats (safetensors; the tensor names are the public interface of `wan encode-prompt`,
// `wan generate --prompt-embeds/--negative-prompt-embeds/--init-latents/--save-latents` and
// `wan decode --latents`):
//   embeddings file: "prompt_embeds" [L, text_dim], the UMT5 output of the L real tokens of one
//                    prompt (EOS included, no padding: the DiT zero-pads to text_len itself);
//                    1 <= L <= 512. [1, L, text_dim] is accepted too. Any float dtype on read,
//                    F32 on write. The negative prompt's file uses the same tensor name.
//   latents file:    "latents" [C, T_lat, H_lat, W_lat] (C = z_dim, 16 for the A14B tasks), the
//                    normalised VAE latent space the DiT samples in; [1, C, T, H, W] accepted
//                    too. Any float dtype on read, F32 on write.
//   state file:      a paused run (`wan generate --save-state F --stop-after-steps N`, continued by
//                    `--resume F`; struct RunState of pipeline.h), all tensors required unless noted:
//                      "latents"                [C, T_lat, H_lat, W_lat] F32 after `step` steps
//                      "state.step"             [1] I64: steps done (1..steps)
//                      "state.fingerprint"      [k] U8: UTF-8 JSON object, plan_fingerprint() of the run
//                      "sampler.m_last", "sampler.m_prev", "sampler.last_sample"
//                                               [n] F32 each, n = numel(latents): the solver's history
//                                               (absent when the solver has none: Euler none, DPM++
//                                               no last_sample)
//                      "prompt_embeds", "negative_prompt_embeds"  [L, text_dim] F32: the encoded text
//                      "timings.stage_s"        [4] F64: load text encoder, encode, load DiT, denoise
//                                               seconds of the processes so far
//                      "timings.step_s"         [step] F64: seconds of every step done
//                      "timings.peak_bytes"     [2] I64: peak device memory in use, peak host RSS
// Metadata (string -> string) is informative only ("prompt", "task", "seed", ...); readers never
// depend on it.

constexpr const char* kPromptEmbedsTensor = "prompt_embeds";
constexpr const char* kLatentsTensor = "latents";

// [L, D] f32 (contiguous copy).
Tensor read_prompt_embeds(const std::string& path);
void write_prompt_embeds(const std::string& path, const Tensor& embeds,
                         const std::map<std::string, std::string>& metadata = {});

// [C, T, H, W] f32 (contiguous copy).
Tensor read_latents(const std::string& path);
void write_latents(const std::string& path, const Tensor& latents,
                   const std::map<std::string, std::string>& metadata = {});

// Paused runs. read_run_state validates everything it can without the plan (tensors present with the
// dtypes and shapes above, sizes consistent, values finite, fingerprint valid JSON); the caller checks
// the fingerprint and the step against its plan.
struct RunState;
void write_run_state(const std::string& path, const RunState& state,
                     const std::map<std::string, std::string>& metadata = {});
RunState read_run_state(const std::string& path);

// Writes text to path through "<path>.tmp" + rename.
void write_text_file(const std::string& path, const std::string& text);

// Checks, before any heavy work, that `path` can be created: not empty, not an existing folder,
// and its parent folder exists. `what` names the option in the message ("--output").
void check_output_path(const std::string& path, const std::string& what);

// Files a command writes, committed together: each one registered with add() once it has been
// written is removed again when the object is destroyed without commit() (a later output failed,
// Ctrl-C). Registering only after a successful write means a file that existed before the run is
// never removed by a failure that happened before it was replaced. A PNG sequence registers every
// frame path.
class PendingOutputs {
 public:
  PendingOutputs() = default;
  PendingOutputs(const PendingOutputs&) = delete;
  PendingOutputs& operator=(const PendingOutputs&) = delete;
  ~PendingOutputs();
  void add(const std::string& path) { paths_.push_back(path); }
  void commit() { paths_.clear(); }
  void rollback();  // removes the registered files now

 private:
  std::vector<std::string> paths_;
};

}  // namespace wan
