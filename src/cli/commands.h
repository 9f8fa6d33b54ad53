// The `wan` subcommands. Each returns the process exit code; wan::Error escaping one is turned into
// "error: <message>" and exit code 2 (bad input) or 1 (internal) by main(). Each command's option
// table (api::CommandSpec) gives its help and its parser; main() uses it for `wan help CMD`.
#pragma once
#include "api/options.h"
#include "bench/commands.h"  // the bench* commands

namespace wan::cli {
int cmd_inspect(int argc, char** argv);          // src/cli/cmd_inspect.cpp
int cmd_make_checkpoint(int argc, char** argv);  // src/cli/cmd_make_checkpoint.cpp
int cmd_make_lora(int argc, char** argv);        // src/cli/cmd_make_lora.cpp (random LoRA files)
int cmd_presets(int argc, char** argv);          // src/cli/cmd_presets.cpp (generate --preset NAME)
int cmd_forward(int argc, char** argv);          // src/cli/cmd_forward.cpp (DiT forward on a checkpoint)
int cmd_generate(int argc, char** argv);         // src/cli/cmd_generate.cpp (text -> video)
int cmd_encode_prompt(int argc, char** argv);    // src/cli/cmd_encode_prompt.cpp (prompt -> embeddings file)
int cmd_decode(int argc, char** argv);           // src/cli/cmd_decode.cpp (latents file -> video)
int cmd_serve(int argc, char** argv);            // src/cli/cmd_serve.cpp (HTTP server, src/server)

// The option table of make-checkpoint, which lives next to its code (the others: api/commands.h,
// bench/commands.h).
const api::CommandSpec& make_checkpoint_spec();
const api::CommandSpec& make_lora_spec();
const api::CommandSpec& presets_spec();
}  // namespace wan::cli
