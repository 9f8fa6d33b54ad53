// The `wan bench*` entry points and their option tables. The CLI dispatches to them (cli/commands.h);
// they live in wan_bench so the harnesses depend on the engine only, never on the command line.
#pragma once
#include "api/options.h"

namespace wan::cli {
int cmd_bench(int argc, char** argv);            // bench/cmd_bench.cpp (GPU DiT step timing, random weights)
int cmd_bench_vae(int argc, char** argv);        // bench/cmd_bench_vae.cpp (GPU VAE decode timing, random weights)
int cmd_bench_attention(int argc, char** argv);  // bench/cmd_bench_attention.cpp (own vs cuDNN attention timing)
int cmd_bench_load(int argc, char** argv);       // bench/cmd_bench_load.cpp (`wan bench --load PATH`: start-up)
int cmd_bench_gemm(int argc, char** argv);       // bench/cmd_bench_gemm.cpp (bf16 vs FP8 GEMM timing)

const api::CommandSpec& bench_spec();
const api::CommandSpec& bench_vae_spec();
const api::CommandSpec& bench_attention_spec();
const api::CommandSpec& bench_load_spec();
const api::CommandSpec& bench_gemm_spec();
}  // namespace wan::cli
