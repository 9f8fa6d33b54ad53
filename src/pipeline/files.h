// The pipeline's own files: prompt embeddings, latents, run states, and the checks on output paths.
//
// Invariants: readers validate before returning (tensor present, rank, non-empty, all values
// finite) and throw one-line wan::Error naming the file; writers go through formats/output_file.h (a
// unique temporary file renamed over the target), so a file is either complete or absent; an output
// is checked writable before any heavy work and is never one of the run's input files.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "ckpt/layout.h"
#include "core/tensor.h"
#include "formats/video.h"

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

// Writes text to path (formats/output_file.h: temporary file + rename).
void write_text_file(const std::string& path, const std::string& text);

// A file named by an option or a role: what = "--output", path = "o.mp4".
struct NamedFile {
  std::string what, path;
};

// Checks, before any heavy work, that `path` can be written: a file name whose folder exists, not a
// folder, and its temporary file can be created there now (formats/output_file.h; a symlink is
// written through to its target). `what` names the option in the message ("--output").
void check_output_path(const std::string& path, const std::string& what);

// The checks on a video output before any heavy work: a known extension (and FFmpeg for .mp4),
// check_output_path, and for a PNG sequence no frames of its pattern in the folder already
// (formats/video.h) unless overwrite_frames (--overwrite-frames). Returns the format.
VideoFormat check_video_output(const std::string& path, const std::string& what, bool overwrite_frames);

// The files a checkpoint is read from: each component that is a file, and every file under a
// component's folder (weights, shards and their index, configs, tokenizer files).
std::vector<NamedFile> checkpoint_input_files(const CheckpointInfo& info);

// Refuses, in one line naming both, an output that is the same file as an input or as another output
// (formats/output_file.h same_file: the resolved path, or the device and inode, so symlinks and hard
// links are caught). Entries with an empty path are skipped.
void check_outputs_distinct(const std::vector<NamedFile>& outputs, const std::vector<NamedFile>& inputs);

// A video output as the files it becomes: one file, or for a PNG sequence of `frames` frames each frame.
std::vector<NamedFile> video_output_files(const NamedFile& output, int frames);

// generate's outputs (GenerateOptions::outputs, PNG sequences expanded to their frames) against every
// file the plan reads: the checkpoint's, the embeddings, the initial latents and the resumed state.
struct GenerateOptions;
struct GeneratePlan;
void check_generate_outputs(const GenerateOptions& o, const GeneratePlan& p);

}  // namespace wan
