// `wan` command line: dispatches to subcommands and turns errors into one line and an exit code.
// Exit codes (README "Exit codes"): 0 success, 2 bad input or a request that cannot fit (wan::Error of kind
// BadInput, std::bad_alloc), 1 internal error; commands return 130 / 143 when a signal stopped them.
// Every command has an option table (api::CommandSpec); `wan help CMD`, `wan CMD --help` and
// `wan CMD -h` print the help generated from it.
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "core/printable.h"
#include "api/commands.h"
#include "api/serve_options.h"
#include "cli/commands.h"
#include "core/error.h"

namespace {
struct Command {
  const char* name;
  int (*fn)(int, char**);
  const wan::api::CommandSpec& (*spec)();
};
constexpr Command kCommands[] = {
    {"generate", wan::cli::cmd_generate, wan::api::generate_spec},
    {"encode-prompt", wan::cli::cmd_encode_prompt, wan::api::encode_prompt_spec},
    {"decode", wan::cli::cmd_decode, wan::api::decode_spec},
    {"inspect", wan::cli::cmd_inspect, wan::api::inspect_spec},
    {"make-checkpoint", wan::cli::cmd_make_checkpoint, wan::cli::make_checkpoint_spec},
    {"make-lora", wan::cli::cmd_make_lora, wan::cli::make_lora_spec},
    {"presets", wan::cli::cmd_presets, wan::cli::presets_spec},
    {"serve", wan::cli::cmd_serve, wan::api::serve_spec},
    {"forward", wan::cli::cmd_forward, wan::api::forward_spec},
    {"bench", wan::cli::cmd_bench, wan::cli::bench_spec},
    {"bench-vae", wan::cli::cmd_bench_vae, wan::cli::bench_vae_spec},
    {"bench-attention", wan::cli::cmd_bench_attention, wan::cli::bench_attention_spec},
    {"bench-gemm", wan::cli::cmd_bench_gemm, wan::cli::bench_gemm_spec},
    {"bench-load", wan::cli::cmd_bench_load, wan::cli::bench_load_spec},
};

void usage(FILE* f) {
  fprintf(f, "usage: wan <command> [options]\n\ncommands:\n");
  for (const auto& c : kCommands) fprintf(f, "  %-16s %s\n", c.name, c.spec().summary.c_str());
  fprintf(f, "\n'wan help <command>' or 'wan <command> --help' shows a command's options.\n");
}

const Command* find_command(const std::string& name) {
  for (const auto& c : kCommands)
    if (name == c.name) return &c;
  return nullptr;
}

int unknown_command(const std::string& name) {
  fprintf(stderr, "error: unknown command '%s' (try 'wan --help')\n", wan::printable(name).c_str());
  return 2;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || (cmd == "help" && argc == 2)) {
    usage(stdout);
    return 0;
  }
  if (cmd == "help") {
    if (argc > 3) {
      fprintf(stderr, "error: 'wan help' takes one command, got %d arguments\n", argc - 2);
      return 2;
    }
    const Command* c = find_command(argv[2]);
    if (!c) return unknown_command(argv[2]);
    printf("%s", wan::api::help_text(c->spec()).c_str());
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
  const Command* c = find_command(cmd);
  if (!c) return unknown_command(cmd);
  try {
    return c->fn(argc - 1, argv + 1);
  } catch (const wan::Error& e) {
    // Messages quote user text (paths, prompts, values): printable() keeps the error one valid line.
    fprintf(stderr, "error: %s\n", wan::printable(e.what()).c_str());
    return e.kind() == wan::ErrorKind::BadInput ? 2 : 1;
  } catch (const std::bad_alloc&) {
    // A request too large for this machine, like a plan that does not fit: exit 2.
    fprintf(stderr, "error: out of host memory (the request is too large for this machine)\n");
    return 2;
  } catch (const std::exception& e) {
    fprintf(stderr, "error: internal: %s\n", wan::printable(e.what()).c_str());
    return 1;
  }
}
