// `wan encode-prompt`: one prompt through the checkpoint's tokenizer and UMT5 encoder into an
// embeddings file ("prompt_embeds" [L, text_dim] f32, the format `wan generate --prompt-embeds`
// reads; see src/pipeline/files.h). Lets prompts be encoded once (or on another machine) and the
// text encoder be skipped by generate.
#include <chrono>
#include <cstdio>
#include <string>

#include "api/commands.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "ckpt/layout.h"
#include "pipeline/checkpoint_check.h"
#include "pipeline/files.h"
#include "pipeline/host_memory.h"
#include "pipeline/models.h"
#include "pipeline/pipeline.h"

namespace wan::cli {

int cmd_encode_prompt(int argc, char** argv) {
  const auto t0 = std::chrono::steady_clock::now();
  const api::Values a = api::parse_argv(api::encode_prompt_spec(), argc, argv);
  if (api::print_help_if_asked(a, api::encode_prompt_spec())) return 0;
  const bool quiet = a.flag("quiet");
  const std::string model = a.require("model");
  const std::string output = a.require("output");
  auto prompt = a.get("prompt");
  WAN_CHECK(prompt.has_value() != a.flag("default-negative"), "give exactly one of --prompt TEXT and --default-negative");
  const std::string text = prompt ? *prompt : std::string(kDefaultNegativePrompt);
  check_output_path(output, "--output");

  const CheckpointInfo info = detect_checkpoint(model);
  check_outputs_distinct({{"--output", output}}, checkpoint_input_files(info));
  WAN_CHECK(info.has(Role::TextEncoder), info.root, ": checkpoint has no text encoder");
  WAN_CHECK(info.has(Role::Tokenizer), info.root, ": checkpoint has no tokenizer");
  validate_checkpoint(info, {Role::TextEncoder});  // headers, byte ranges and tensors before the heavy load
  check_text_encoder_memory(t5_config_for(info));

  ProgressPrinter printer = ProgressPrinter::for_stderr(quiet);
  ProgressEvent e;
  e.stage = Stage::LoadTextEncoder;
  printer(e);
  auto t1 = std::chrono::steady_clock::now();
  TextEncoder te = load_text_encoder(info);
  e.kind = ProgressEvent::End;
  e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  printer(e);
  t1 = std::chrono::steady_clock::now();
  e.kind = ProgressEvent::Begin;
  e.stage = Stage::EncodeText;
  printer(e);
  Tensor emb = encode_prompt(te, text);
  e.kind = ProgressEvent::End;
  e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  printer(e);

  write_prompt_embeds(output, emb, {{"prompt", text}, {"model", info.root}});
  if (!quiet) {
    printf("wrote %s (prompt_embeds %s)\n", output.c_str(), emb.shape().str().c_str());
    printf("total %.2f s, peak memory %.1f MiB\n",
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
           static_cast<double>(peak_rss_bytes()) / (1024.0 * 1024.0));
  }
  return 0;
}

}  // namespace wan::cli
