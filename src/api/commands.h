// The option tables of the engine's commands (generate, decode, encode-prompt, forward, inspect) and
// the translation of a parsed generate request into the pipeline's GenerateOptions. The command line
// (src/cli) and the HTTP server read these same tables, so an option, its default and its checks are
// written once. The bench harnesses and make-checkpoint keep their tables next to their code.
#pragma once
#include <string>
#include <vector>

#include "api/options.h"
#include "pipeline/generate_parallel.h"
#include "pipeline/pipeline.h"

namespace wan::api {

const CommandSpec& generate_spec();
const CommandSpec& decode_spec();
const CommandSpec& encode_prompt_spec();
const CommandSpec& forward_spec();
const CommandSpec& inspect_spec();

// The default --output of generate: .mp4 when this build has FFmpeg, else .y4m.
std::string default_video_output();

// --gemm bf16|fp8 and --precision exact|fp8 (generate and bench): their table rows, and the DiT GEMM
// kind a request asks for ("bf16" | "fp8"; --precision fp8 means --gemm fp8, and the two must agree when
// both are given). kPrecisionFp8Note: the one line a front end prints for --precision fp8.
void add_gemm_rows(std::vector<Option>& t);
std::string gemm_from(const Values& v);
// --attention, or own-fp8 for --precision fp8 (a contradicting --attention is an OptionError).
std::string attention_from(const Values& v);
extern const char* const kPrecisionFp8Note;

// --memory-budget SIZE and --host-memory-budget SIZE (generate, bench, serve: issue 27's low-memory
// mode): their rows, and the bytes of a SIZE ("24GiB", "24G" and "24000MiB" are binary; "24GB" decimal;
// a bare number is bytes). Throws OptionError naming `key` for anything else, or 0.
void add_memory_budget_rows(std::vector<Option>& t);
int64_t parse_memory_size(const std::string& s, const std::string& key);

// --vae-tile auto|off|WxH|N (generate, serve): its row, and its value. A fixed tile is in pixels, width x
// height as --size (N: N x N), each a multiple of 64 and at least 128 (64 = 4 latent pixels of the Wan 2.2
// VAE, so the 1/4 overlap is whole latent pixels for both VAEs). Throws OptionError naming `key`.
void add_vae_tile_row(std::vector<Option>& t);
VaeTileRequest parse_vae_tile(const std::string& s, const std::string& key);

// A generate request's options as the pipeline takes them; `parallel` receives the multi-GPU options
// as given (parse_parallel_request checks them with the launcher's environment). Throws OptionError.
GenerateOptions generate_options(const Values& v, ParallelArgs* parallel);

}  // namespace wan::api
