// Running the `wan` binary (or any program) from a CPU test with its output captured.
// slurp(path): a whole file as a string ("" when it cannot be read).
// run_captured(bin, args, env): forks and execs `bin args...` with stdout and stderr redirected to files
// in a fresh TempDir, waits, and returns the exit code (128 + signal when killed; 127 when exec failed)
// and both streams. env: nullptr inherits this process's environment, otherwise the complete
// environment as KEY=VALUE strings. Buffered stdio is flushed before the fork so that nothing written
// by the test is duplicated in the child.
#pragma once
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace wan::test {

struct RunResult {
  int code = -1;
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline RunResult run_captured(const std::string& bin, const std::vector<std::string>& args,
                              const std::vector<std::string>* env = nullptr) {
  TempDir io("run");
  const std::string out = io / "stdout", err = io / "stderr";
  std::string prog = bin;
  std::vector<std::string> arg_copy = args, env_copy = env ? *env : std::vector<std::string>{};
  std::vector<char*> argv{prog.data()};
  for (std::string& a : arg_copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (std::string& kv : env_copy) envp.push_back(kv.data());
  envp.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(o, 1);
    dup2(e, 2);
    if (env) execve(prog.c_str(), argv.data(), envp.data());
    else execv(prog.c_str(), argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  RunResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

}  // namespace wan::test
