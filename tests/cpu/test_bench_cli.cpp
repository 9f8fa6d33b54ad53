// `wan bench` option checks, run as a user runs them (the binary at WAN_BINARY, a child process per
// call). Only bad values and --help: they are rejected before any device work, so these run (and must
// pass) in every build, with or without CUDA or a GPU. Covers --profile-reps (the in-step breakdown).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

struct Result {
  int code = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Result run_wan(std::vector<std::string> args) {
  wan::test::TempDir io("bench_cli");
  const std::string out = io / "stdout", err = io / "stderr";
  const pid_t pid = fork();
  if (pid == 0) {
    const int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(o, 1);
    dup2(e, 2);
    std::string bin = WAN_BINARY;
    std::vector<char*> argv{bin.data()};
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  Result r;
  int status = 0;
  waitpid(pid, &status, 0);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

TEST(BenchCli, HelpListsProfileReps) {
  const Result r = run_wan({"bench", "--help"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("--profile-reps N"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("0: no in-step breakdown"), std::string::npos) << r.out;
}

TEST(BenchCli, BadProfileRepsIsOneClearError) {
  struct Case {
    std::string value, expect;
  };
  for (const Case& c : {Case{"abc", "option --profile-reps: 'abc' is not an integer"},
                        Case{"2x", "option --profile-reps: '2x' is not an integer"},
                        Case{"-1", "--profile-reps -1: expected 0..100 (0: no in-step breakdown)"},
                        Case{"101", "--profile-reps 101: expected 0..100 (0: no in-step breakdown)"}}) {
    const Result r = run_wan({"bench", "--size", "832x480", "--layers", "1", "--profile-reps", c.value});
    EXPECT_EQ(r.code, 2) << c.value << ": " << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.value << ": " << r.err;
    EXPECT_EQ(lines(r.err), 1) << c.value << ": " << r.err;
    EXPECT_EQ(r.out, "") << c.value;
  }
  // The option needs its value.
  const Result r = run_wan({"bench", "--profile-reps"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("profile-reps"), std::string::npos) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
}

}  // namespace
