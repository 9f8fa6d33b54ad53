// `wan bench` option checks, run as a user runs them (the binary at WAN_BINARY, a child process per
// call). Only bad values and --help: they are rejected before any device work, so these run (and must
// pass) in every build, with or without CUDA or a GPU. Covers --profile-reps (the in-step breakdown),
// --distinct-latents, --uniform-t and ti2v-5B's geometry, `wan bench-attention --input-std`,
// `wan bench-vae --vae / --encode` with Wan 2.2's stride 16, and `wan bench-gemm --gemm / --m`.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "run_util.h"

namespace {

using Result = wan::test::RunResult;

Result run_wan(const std::vector<std::string>& args) { return wan::test::run_captured(WAN_BINARY, args); }

int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

struct BadValue {
  std::string value, expect;
};
// Each bad value appended to `args`: exit status 2, one line on stderr containing `expect`, nothing on stdout.
void expect_one_clear_error(const std::vector<std::string>& args, const std::vector<BadValue>& bad) {
  for (const BadValue& c : bad) {
    std::vector<std::string> a = args;
    a.push_back(c.value);
    const Result r = run_wan(a);
    EXPECT_EQ(r.code, 2) << c.value << ": " << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.value << ": " << r.err;
    EXPECT_EQ(lines(r.err), 1) << c.value << ": " << r.err;
    EXPECT_EQ(r.out, "") << c.value;
  }
}

// FP8 block GEMMs (--gemm fp8, or --precision fp8): listed in the help; a bad value or a contradiction is
// one clear error before any device work.
TEST(BenchCli, GemmAndPrecisionOptions) {
  const Result r = run_wan({"bench", "--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--gemm G"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--precision P"), std::string::npos) << r.out;
  expect_one_clear_error({"bench", "--gemm"}, {{"fp16", "--gemm"}});
  expect_one_clear_error({"bench", "--gemm", "bf16", "--precision"}, {{"fp8", "contradicts --precision fp8"}});
}

TEST(BenchCli, HelpListsProfileReps) {
  const Result r = run_wan({"bench", "--help"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("--profile-reps N"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("0: no in-step breakdown"), std::string::npos) << r.out;
}

// The step is timed with one latent for both CFG samples unless told otherwise (the first block's
// self-attention then runs once, as in the samplers' steps); the help says so.
TEST(BenchCli, HelpListsDistinctLatents) {
  const Result r = run_wan({"bench", "--help"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("--distinct-latents"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("one latent for all samples"), std::string::npos) << r.out;
}

TEST(BenchCli, BadProfileRepsIsOneClearError) {
  expect_one_clear_error({"bench", "--size", "832x480", "--layers", "1", "--profile-reps"},
                         {{"abc", "option --profile-reps: 'abc' is not an integer"},
                          {"2x", "option --profile-reps: '2x' is not an integer"},
                          {"-1", "--profile-reps -1: expected 0..100 (0: no in-step breakdown)"},
                          {"101", "--profile-reps 101: expected 0..100 (0: no in-step breakdown)"}});
  // The option needs its value.
  const Result r = run_wan({"bench", "--profile-reps"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("profile-reps"), std::string::npos) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
}

// ti2v-5B runs its image mode's per-token timesteps unless --uniform-t; the help says so, and that its
// default size is its pipeline's 1280x704.
TEST(BenchCli, HelpListsUniformT) {
  const Result r = run_wan({"bench", "--help"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("--uniform-t"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1280x704"), std::string::npos) << r.out;
}

// ti2v-5B's VAE strides 16, so its sizes are multiples of 32 (1280x720 is not); refused before any device work.
TEST(BenchCli, Ti2vSizeIsOneClearError) {
  expect_one_clear_error({"bench", "--task", "ti2v-5B", "--layers", "1", "--size"},
                         {{"1280x720", "--size 1280x720: width and height must be multiples of 32 for ti2v-5B"}});
  expect_one_clear_error({"bench", "--task", "ti2v-5B", "--layers"}, {{"31", "--layers '31': expected counts in 1..30"}});
}

// `wan bench-attention --input-std S`: the spread of the random Q/K/V (the kernels' speed depends on the
// data under the power cap). Bad values are rejected before any device work.
TEST(BenchAttentionCli, HelpListsInputStd) {
  const Result r = run_wan({"bench-attention", "--help"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("--input-std S"), std::string::npos) << r.out;
}

TEST(BenchAttentionCli, BadInputStdIsOneClearError) {
  expect_one_clear_error({"bench-attention", "--cases", "self-32760", "--input-std"},
                         {{"abc", "option --input-std: 'abc' is not a number"},
                          {"0", "--input-std 0: expected a value in (0, 64]"},
                          {"-1", "--input-std -1: expected a value in (0, 64]"},
                          {"65", "--input-std 65: expected a value in (0, 64]"},
                          {"nan", "option --input-std: 'nan' must be a finite number"}});
}

// `wan bench-vae --vae wan2.2 [--encode]`: Wan 2.2's VAE strides 16, so its sizes are multiples of 16;
// refused before any device work, as are unknown VAEs.
TEST(BenchVaeCli, HelpListsVaeAndEncode) {
  const Result r = run_wan({"bench-vae", "--help"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("--vae V"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--encode"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1280x704"), std::string::npos) << r.out;
}

TEST(BenchVaeCli, BadVaeOrSizeIsOneClearError) {
  expect_one_clear_error({"bench-vae", "--vae"}, {{"wan2.3", "unknown --vae 'wan2.3' (valid: wan2.1, wan2.2)"}});
  expect_one_clear_error({"bench-vae", "--vae", "wan2.2", "--encode", "--size"},
                         {{"1280x712", "--size 1280x712: width and height must be multiples of 16 for wan2.2"}});
  expect_one_clear_error({"bench-vae", "--frames"}, {{"4", "--frames 4: must be 4n+1"}});
}

// `wan bench-gemm`: bf16 vs FP8 GEMMs at the DiT's shapes; bad values are refused before any device work.
TEST(BenchGemmCli, HelpListsGemmAndCases) {
  const Result r = run_wan({"bench-gemm", "--help"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("--gemm bf16|fp8|both"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--m N"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("75600"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ffn.0: M = --m, 5120 -> 13824"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cross-kv: M = 512"), std::string::npos) << r.out;
}

TEST(BenchGemmCli, BadValuesAreOneClearError) {
  expect_one_clear_error({"bench-gemm", "--gemm"}, {{"fp16", "unknown --gemm 'fp16' (valid: bf16, fp8, both)"}});
  expect_one_clear_error({"bench-gemm", "--m"}, {{"0", "--m 0: expected 1..1000000"},
                                                 {"2000000", "--m 2000000: expected 1..1000000"},
                                                 {"abc", "option --m: 'abc' is not an integer"}});
  expect_one_clear_error({"bench-gemm", "--gemm", "fp8", "--reps"}, {{"0", "--reps 0: expected 1..1000"}});
  expect_one_clear_error({"bench-gemm", "--device"}, {{"cpu", "--device cpu: the benchmarks run on a GPU"}});
}

}  // namespace
