// The `wan` subcommands. Each returns the process exit code; wan::Error escaping one is turned into
// "error: <message>" and exit code 2 (bad input) or 1 (internal) by main().
#pragma once
namespace wan::cli {
int cmd_inspect(int argc, char** argv);          // src/cli/cmd_inspect.cpp
int cmd_make_checkpoint(int argc, char** argv);  // src/cli/cmd_make_checkpoint.cpp
int cmd_forward(int argc, char** argv);          // src/cli/cmd_forward.cpp (DiT forward on a checkpoint)
}  // namespace wan::cli
