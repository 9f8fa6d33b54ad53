// The `wan` subcommands. Each returns the process exit code; wan::Error escaping one is turned into
// "error: <message>" and exit code 2 (bad input) or 1 (internal) by main(). Each command's option
// table (api::CommandSpec) gives its help and its parser; main() uses it for `wan help CMD`.
#pragma once
#include "api/options.h"

namespace wan::cli {
int cmd_inspect(int argc, char** argv);          // src/cli/cmd_inspect.cpp
int cmd_make_checkpoint(int argc, char** argv);  // src/cli/cmd_make_checkpoint.cpp
int cmd_forward(int argc, char** argv);          // src/cli/cmd_forward.cpp (DiT forward on a checkpoint)
int cmd_generate(int argc, char** argv);         // src/cli/cmd_generate.cpp (text -> video)
int cmd_encode_prompt(int argc, char** argv);    // src/cli/cmd_encode_prompt.cpp (prompt -> embeddings file)
int cmd_decode(int argc, char** argv);           // src/cli/cmd_decode.cpp (latents file -> video)
int cmd_bench(int argc, char** argv);            // src/bench/cmd_bench.cpp (GPU DiT step timing, random weights)
int cmd_bench_vae(int argc, char** argv);        // src/bench/cmd_bench_vae.cpp (GPU VAE decode timing, random weights)
int cmd_bench_attention(int argc, char** argv);  // src/bench/cmd_bench_attention.cpp (own vs cuDNN attention timing)
int cmd_bench_load(int argc, char** argv);       // src/bench/cmd_bench_load.cpp (`wan bench --load PATH`: start-up)

// The option tables of the commands whose tables live next to their code (the others: api/commands.h).
const api::CommandSpec& make_checkpoint_spec();
const api::CommandSpec& bench_spec();
const api::CommandSpec& bench_vae_spec();
const api::CommandSpec& bench_attention_spec();
const api::CommandSpec& bench_load_spec();
}  // namespace wan::cli
