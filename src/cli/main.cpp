// `wan` command line: dispatches to subcommands and turns errors into one line and an exit code.
// Exit codes: 0 success, 2 bad input (wan::Error of kind BadInput), 1 internal error.
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "cli/commands.h"
#include "core/error.h"

namespace {
struct Command {
  const char* name;
  int (*fn)(int, char**);
  const char* help;
};
constexpr Command kCommands[] = {
    {"generate", wan::cli::cmd_generate, "text to video (Wan 2.2 T2V-A14B) on the CPU"},
    {"encode-prompt", wan::cli::cmd_encode_prompt, "encode a prompt into an embeddings file"},
    {"decode", wan::cli::cmd_decode, "decode a latents file into a video with the VAE"},
    {"inspect", wan::cli::cmd_inspect, "show layout, task, components, config and tensors of a checkpoint"},
    {"make-checkpoint", wan::cli::cmd_make_checkpoint, "write a random-weight checkpoint in a real layout"},
    {"forward", wan::cli::cmd_forward, "run one DiT forward pass on the CPU on random inputs"},
    {"bench", wan::cli::cmd_bench, "time DiT denoising steps on the GPU with random weights (s/step, breakdown)"},
    {"bench-vae", wan::cli::cmd_bench_vae, "time the GPU VAE decode with random weights (s, peak memory)"},
    {"bench-attention", wan::cli::cmd_bench_attention, "time the own and the cuDNN attention kernels (ms, TFLOP/s)"},
    {"bench-load", wan::cli::cmd_bench_load, "checkpoint load to the GPU vs page-cache read and H2D (= bench --load)"},
};

void usage(FILE* f) {
  fprintf(f, "usage: wan <command> [options]\n\ncommands:\n");
  for (const auto& c : kCommands) fprintf(f, "  %-16s %s\n", c.name, c.help);
  fprintf(f, "\n'wan <command> --help' shows a command's options.\n");
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    usage(stdout);
    return 0;
  }
  if (cmd == "--version") {
    printf("wan 0.1.0\n");
    return 0;
  }
  // `wan bench --load PATH` is the load benchmark (cmd_bench_load.cpp), not the DiT step benchmark.
  if (cmd == "bench")
    for (int i = 2; i < argc; ++i)
      if (std::strcmp(argv[i], "--load") == 0 || std::strncmp(argv[i], "--load=", 7) == 0) cmd = "bench-load";
  for (const auto& c : kCommands) {
    if (cmd != c.name) continue;
    try {
      return c.fn(argc - 1, argv + 1);
    } catch (const wan::Error& e) {
      fprintf(stderr, "error: %s\n", e.what());
      return e.kind() == wan::ErrorKind::BadInput ? 2 : 1;
    } catch (const std::bad_alloc&) {
      fprintf(stderr, "error: out of host memory\n");
      return 1;
    } catch (const std::exception& e) {
      fprintf(stderr, "error: internal: %s\n", e.what());
      return 1;
    }
  }
  fprintf(stderr, "error: unknown command '%s' (try 'wan --help')\n", cmd.c_str());
  return 2;
}
