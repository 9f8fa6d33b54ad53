// The `wan generate`, `wan encode-prompt` and `wan decode` commands, run as a user runs them (the
// binary at WAN_BINARY, a child process per call): the golden run of tests/fixtures/pipeline through
// the CLI, byte-identical results for the same seed, the official and diffusers layouts of one
// `make-checkpoint` model agreeing, --timings-json content, y4m frame counts, every bad-input case
// (exit 2, one line on stderr, no output file) and Ctrl-C (exit 130, no output file).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "formats/safetensors.h"
#include "run_util.h"
#include "tensor_compare.h"

namespace fs = std::filesystem;
using wan::cat;

namespace {

using wan::test::load_tensor;
using wan::test::max_rel;

const std::string kFix = std::string(WAN_FIXTURES) + "/pipeline";
const std::string kModel = kFix + "/model";

using wan::test::TempDir;

std::string read_file(const std::string& path) { return wan::test::slurp(path); }

using Result = wan::test::RunResult;

[[noreturn]] void exec_wan(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  std::string bin = WAN_BINARY;
  argv.push_back(bin.data());
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv(bin.c_str(), argv.data());
  _exit(127);
}

// Runs `wan args...` with stdout / stderr captured in files.
Result run_wan(const std::vector<std::string>& args) { return wan::test::run_captured(WAN_BINARY, args); }

std::string fixture_prompt() {
  auto f = wan::SafetensorsFile::open(kFix + "/expected.safetensors");
  return nlohmann::json::parse(f->metadata().at("settings")).at("prompt").get<std::string>();
}

// The fixture's run (tests/fixtures/pipeline/README.md).
std::vector<std::string> golden_args(const TempDir& t) {
  return {"generate", "--model", kModel, "--prompt-embeds", kFix + "/prompt_embeds.safetensors",
          "--negative-prompt-embeds", kFix + "/negative_prompt_embeds.safetensors", "--init-latents",
          kFix + "/init_latents.safetensors", "--steps", "4", "--schedule", "diffusers", "--guide-scale", "3,4",
          "--output", t / "out.y4m"};
}

// args with option `opt` set to `value` (replaced when present, appended otherwise); value "" with
// drop = true removes the option and its value.
std::vector<std::string> with(std::vector<std::string> args, const std::string& opt, const std::string& value,
                              bool drop = false) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] != opt) continue;
    if (drop) {
      args.erase(args.begin() + static_cast<long>(i), args.begin() + static_cast<long>(i) + 2);
    } else {
      args[i + 1] = value;
    }
    return args;
  }
  if (!drop) {
    args.push_back(opt);
    if (!value.empty() || opt == "--prompt") args.push_back(value);
  }
  return args;
}

struct Y4m {
  int width = 0, height = 0, frames = 0;
  bool ok = false;
};
// Header "YUV4MPEG2 W.. H.. ..." then "FRAME\n" + 3 planes of W*H bytes (4:4:4) per frame.
Y4m parse_y4m(const std::string& path) {
  Y4m y;
  const std::string s = read_file(path);
  size_t eol = s.find('\n');
  if (s.rfind("YUV4MPEG2 ", 0) != 0 || eol == std::string::npos) return y;
  std::istringstream hs(s.substr(0, eol));
  std::string tok;
  while (hs >> tok) {
    if (tok[0] == 'W') y.width = std::stoi(tok.substr(1));
    if (tok[0] == 'H') y.height = std::stoi(tok.substr(1));
  }
  size_t pos = eol + 1;
  const size_t frame = 3ull * static_cast<size_t>(y.width) * static_cast<size_t>(y.height);
  while (pos < s.size()) {
    if (s.compare(pos, 6, "FRAME\n") != 0) return y;
    pos += 6 + frame;
    ++y.frames;
  }
  y.ok = pos == s.size();
  return y;
}

}  // namespace

TEST(GenerateCli, GoldenRunMatchesDiffusersAndWritesY4m) {
  TempDir t;
  Result r = run_wan(with(golden_args(t), "--save-latents", t / "lat.safetensors"));
  ASSERT_EQ(r.code, 0) << r.err;
  const double rel = max_rel(load_tensor(t / "lat.safetensors", "latents"), load_tensor(kFix + "/expected.safetensors", "latents"));
  printf("  CLI final latents max rel err vs diffusers %.2e\n", rel);
  EXPECT_LE(rel, 1e-4);
  Y4m y = parse_y4m(t / "out.y4m");
  EXPECT_TRUE(y.ok);
  EXPECT_EQ(y.frames, 9);
  EXPECT_EQ(y.width, 64);
  EXPECT_EQ(y.height, 48);
  EXPECT_NE(r.out.find("peak memory"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("denoising"), std::string::npos) << r.out;
  // Non-TTY progress: plain lines, no carriage returns.
  EXPECT_NE(r.err.find("denoise: step 4/4"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos);
  // Nothing else written (no temporaries left).
  EXPECT_EQ(t.files(), (std::set<std::string>{"out.y4m", "lat.safetensors"}));
}

TEST(GenerateCli, EncodePromptThenGenerateFromTheFiles) {
  TempDir t;
  Result r = run_wan({"encode-prompt", "--model", kModel, "--prompt", fixture_prompt(), "--output", t / "p.safetensors"});
  ASSERT_EQ(r.code, 0) << r.err;
  r = run_wan({"encode-prompt", "--model", kModel, "--default-negative", "--output", t / "n.safetensors", "--quiet"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(r.out.empty() && r.err.empty()) << r.out << r.err;
  EXPECT_LE(max_rel(load_tensor(t / "p.safetensors", "prompt_embeds"), load_tensor(kFix + "/prompt_embeds.safetensors", "prompt_embeds")),
            1e-4);
  EXPECT_LE(max_rel(load_tensor(t / "n.safetensors", "prompt_embeds"),
                    load_tensor(kFix + "/negative_prompt_embeds.safetensors", "prompt_embeds")),
            1e-4);
  auto args = with(golden_args(t), "--prompt-embeds", t / "p.safetensors");
  args = with(args, "--negative-prompt-embeds", t / "n.safetensors");
  r = run_wan(with(with(args, "--save-latents", t / "lat.safetensors"), "--quiet", ""));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(r.out.empty() && r.err.empty()) << r.out << r.err;
  EXPECT_LE(max_rel(load_tensor(t / "lat.safetensors", "latents"), load_tensor(kFix + "/expected.safetensors", "latents")), 1e-4);
}

TEST(GenerateCli, SameSeedGivesIdenticalFilesAndDecodeReproducesTheVideo) {
  TempDir t;
  auto base = with(with(with(golden_args(t), "--init-latents", "", true), "--size", "48x32"), "--frames", "5");
  base = with(with(base, "--seed", "42"), "--steps", "3");
  Result a = run_wan(with(with(base, "--save-latents", t / "a.safetensors"), "--output", t / "a.y4m"));
  ASSERT_EQ(a.code, 0) << a.err;
  Result b = run_wan(with(with(base, "--save-latents", t / "b.safetensors"), "--output", t / "b.y4m"));
  ASSERT_EQ(b.code, 0) << b.err;
  const std::string la = read_file(t / "a.safetensors");
  EXPECT_GT(la.size(), 16u * 2 * 4 * 6 * 4);
  EXPECT_EQ(la, read_file(t / "b.safetensors"));
  EXPECT_EQ(read_file(t / "a.y4m"), read_file(t / "b.y4m"));
  Result c = run_wan(with(with(base, "--seed", "43"), "--save-latents", t / "c.safetensors"));
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_NE(la, read_file(t / "c.safetensors"));
  // `wan decode` of the saved latents writes the very same video.
  Result d = run_wan({"decode", "--model", kModel, "--latents", t / "a.safetensors", "--output", t / "d.y4m",
                      "--timings-json", t / "d.json"});
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_EQ(read_file(t / "d.y4m"), read_file(t / "a.y4m"));
  Y4m y = parse_y4m(t / "d.y4m");
  EXPECT_TRUE(y.ok);
  EXPECT_EQ(y.frames, 5);
  auto j = nlohmann::json::parse(read_file(t / "d.json"));
  EXPECT_EQ(j.at("command"), "decode");
  EXPECT_GT(j.at("timings").at("vae_decode_s").get<double>(), 0.0);
}

TEST(GenerateCli, TimingsJsonReportsEveryStage) {
  TempDir t;
  Result r = run_wan(with(golden_args(t), "--timings-json", t / "t.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(read_file(t / "t.json"));
  EXPECT_EQ(j.at("command"), "generate");
  EXPECT_EQ(j.at("task"), "t2v-A14B");
  EXPECT_EQ(j.at("width"), 64);
  EXPECT_EQ(j.at("height"), 48);
  EXPECT_EQ(j.at("frames"), 9);
  EXPECT_EQ(j.at("steps"), 4);
  EXPECT_EQ(j.at("sampler"), "unipc");
  EXPECT_EQ(j.at("schedule"), "diffusers");
  EXPECT_FALSE(j.contains("seed"));  // the initial latents were given
  const auto& tm = j.at("timings");
  for (const char* k : {"load_s", "load_text_encoder_s", "load_dit_s", "load_vae_s", "text_encode_s", "denoise_s",
                        "mean_step_s", "vae_decode_s", "write_s", "total_s"}) {
    ASSERT_TRUE(tm.contains(k)) << k;
    EXPECT_GE(tm.at(k).get<double>(), 0.0) << k;
  }
  EXPECT_EQ(tm.at("steps"), 4);
  ASSERT_EQ(tm.at("step_s").size(), 4u);
  double sum = 0;
  for (const auto& s : tm.at("step_s")) sum += s.get<double>();
  EXPECT_NEAR(tm.at("mean_step_s").get<double>(), sum / 4, 1e-9);
  EXPECT_GT(tm.at("denoise_s").get<double>(), 0.0);
  EXPECT_GT(tm.at("vae_decode_s").get<double>(), 0.0);
  EXPECT_EQ(tm.at("text_encode_s").get<double>(), 0.0);  // embeddings given
  EXPECT_GE(tm.at("total_s").get<double>(),
            tm.at("load_s").get<double>() + tm.at("denoise_s").get<double>() + tm.at("vae_decode_s").get<double>());
  EXPECT_GT(j.at("peak_rss_bytes").get<int64_t>(), 1 << 20);
}

TEST(GenerateCli, BadInputExitsTwoWithOneLineAndNoOutput) {
  TempDir t;
  fs::create_directories(t.p / "empty_dir");
  { std::ofstream(t / "empty.safetensors"); }
  // A valid safetensors file of the wrong kind, and latents of the wrong shape.
  wan::write_safetensors(t / "lat16x2.safetensors", {{"latents", wan::Tensor::f32(wan::Shape{16, 2, 6, 8})}});
  // A copy of the checkpoint without text encoder and tokenizer.
  fs::create_directories(t.p / "notext");
  for (const char* c : {"model_index.json", "transformer", "transformer_2", "vae", "scheduler"})
    fs::create_symlink(fs::absolute(fs::path(kModel) / c), t.p / "notext" / c);
  const auto g = golden_args(t);
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {with(g, "--model", t / "missing"), "no such file or folder"},
      {with(g, "--model", t / "empty_dir"), "folder is empty"},
      {with(g, "--model", "", true), "missing --model"},
      {with(g, "--task", "t2v-B"), "t2v-B"},
      {with(g, "--task", "i2v-A14B"), "holds a t2v-A14B model"},
      {with(g, "--size", "100x64"), "multiples of 16"},
      {with(g, "--size", "64"), "--size"},
      {with(g, "--frames", "8"), "4n+1"},
      {with(g, "--steps", "abc"), "not an integer"},
      {with(g, "--steps", "0"), "--steps"},
      {with(g, "--guide-scale", "x"), "--guide-scale"},
      {with(g, "--sampler", "ddim"), "ddim"},
      {with(g, "--schedule", "karras"), "karras"},
      {with(g, "--device", "cuda:99"), "CUDA"},
      {with(g, "--device", "gpu"), "is not cpu, cuda"},
      {with(g, "--bogus", "1"), "unknown option --bogus"},
      {with(g, "--gemm", "fp16"), "--gemm"},
      {with(g, "--gemm", "fp8"), "--gemm fp8: FP8 GEMMs run in the GPU DiT only"},
      {with(g, "--precision", "fp8"), "--gemm fp8: FP8 GEMMs run in the GPU DiT only"},
      {with(with(g, "--gemm", "bf16"), "--precision", "fp8"), "--gemm bf16 contradicts --precision fp8"},
      {with(with(g, "--attention", "own"), "--precision", "fp8"), "--attention own contradicts --precision fp8"},
      {with(g, "--attention", "own-fp8"), "--attention own-fp8 applies to --device cuda only"},
      {with(g, "--prompt-embeds", t / "empty.safetensors"), "empty.safetensors"},
      {with(g, "--prompt-embeds", t / "nope.safetensors"), "no such file"},
      {with(g, "--negative-prompt-embeds", t / "lat16x2.safetensors"), "no tensor \"prompt_embeds\""},
      {with(g, "--prompt-embeds", "", true), "missing --prompt"},
      {with(g, "--prompt", "a cat"), "not both"},
      {with(with(g, "--init-latents", t / "lat16x2.safetensors"), "--frames", "9"), "does not match"},
      {with(g, "--output", t / "nodir/out.y4m"), "does not exist"},
      {with(g, "--output", t / "out.avi"), "out.avi"},
      {with(g, "--output", t.p.string()), "is a folder"},
      {with(g, "--save-latents", t / "nodir/l.safetensors"), "does not exist"},
      {with(g, "--timings-json", t / "nodir/t.json"), "does not exist"},
      {with(with(g, "--model", t / "notext"), "--negative-prompt-embeds", "", true), "has no text encoder"},
      {{"generate", "stray", "--model", kModel}, "unexpected argument 'stray'"},
      {{"decode", "--model", kModel, "--latents", t / "nope.safetensors", "--output", t / "d.y4m"}, "no such file"},
      {{"decode", "--model", kModel, "--latents", kFix + "/prompt_embeds.safetensors", "--output", t / "d.y4m"},
       "no tensor \"latents\""},
      {{"decode", "--model", kModel, "--latents", kFix + "/init_latents.safetensors"}, "--output"},
      {{"encode-prompt", "--model", kModel, "--prompt", "x"}, "--output"},
      {{"encode-prompt", "--model", t / "notext", "--prompt", "x", "--output", t / "p.safetensors"},
       "has no text encoder"},
      {{"encode-prompt", "--model", kModel, "--prompt", "x", "--default-negative", "--output", t / "p.safetensors"},
       "exactly one"},
  };
  const std::set<std::string> before = t.files();
  for (const auto& [args, part] : cases) {
    std::string line;
    for (const auto& a : args) line += a + " ";
    SCOPED_TRACE(line);
    Result r = run_wan(args);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(part), std::string::npos) << "stderr: " << r.err << "wanted: " << part;
    EXPECT_EQ(t.files(), before) << "an output file was left behind";
  }
}

// SIGINT (Ctrl-C) and SIGTERM alike: the run stops after the current step, says so, and exits 128 + signal.
static void stop_by_signal(int sig) {
  TempDir t;
  // Many cheap steps (one token), so the run is certainly still sampling when the signal arrives.
  auto args = with(with(with(golden_args(t), "--init-latents", "", true), "--size", "16x16"), "--frames", "1");
  args = with(with(with(args, "--steps", "3000"), "--seed", "1"), "--save-latents", t / "lat.safetensors");
  args = with(args, "--timings-json", t / "t.json");
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pid_t pid = fork();
  if (pid == 0) {
    close(pipefd[0]);
    dup2(pipefd[1], 2);
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    exec_wan(args);
  }
  close(pipefd[1]);
  std::string err;
  char buf[4096];
  bool sent = false;
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    ssize_t n = read(pipefd[0], buf, sizeof buf);
    if (n <= 0) break;
    err.append(buf, static_cast<size_t>(n));
    if (!sent && err.find("denoise: step 1/3000") != std::string::npos) {
      kill(pid, sig);
      sent = true;
    }
  }
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(sent) << err;
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 128 + sig) << err;
  EXPECT_NE(err.find(sig == SIGTERM ? "terminated: stopping after the current step" : "interrupted: stopping after "
                                                                                        "the current step"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("denoise: step 3000/3000"), std::string::npos) << "ran to the end";
  EXPECT_TRUE(t.files().empty()) << "outputs left behind";
  printf("  interrupted run took %.2f s\n", secs);
}

TEST(GenerateCli, CtrlCStopsCleanlyWithoutOutputs) { stop_by_signal(SIGINT); }
TEST(GenerateCli, SigtermStopsCleanlyWithExit143) { stop_by_signal(SIGTERM); }

TEST(GenerateCli, TinyCheckpointFromPromptTextInBothLayouts) {
  // The README's first command: a random-weight tiny model from `wan make-checkpoint`, then generate
  // from a prompt (tokenizer + UMT5 + both experts + VAE). Both layouts hold the same values, so
  // they must give the same bytes.
  TempDir t;
  std::string lat[2];
  int i = 0;
  for (const char* layout : {"official", "diffusers"}) {
    const std::string ck = t / cat("tiny_", layout), out = t / cat("tiny_", layout, ".y4m");
    Result m = run_wan({"make-checkpoint", "--config", "tiny", "--layout", layout, "--out", ck});
    ASSERT_EQ(m.code, 0) << m.err;
    Result r = run_wan({"generate", "--model", ck, "--prompt", "a red fox in the snow", "--size", "32x32", "--frames",
                        "5", "--steps", "2", "--seed", "3", "--output", out, "--save-latents", out + ".st"});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("encode text done"), std::string::npos) << r.err;
    Y4m y = parse_y4m(out);
    EXPECT_TRUE(y.ok);
    EXPECT_EQ(y.frames, 5);
    EXPECT_EQ(y.width, 32);
    lat[i++] = read_file(out + ".st");
    fs::remove_all(ck);
  }
  EXPECT_FALSE(lat[0].empty());
  EXPECT_EQ(lat[0], lat[1]);
}

TEST(GenerateCli, HelpDocumentsTheFiles) {
  Result r = run_wan({"generate", "--help"});
  EXPECT_EQ(r.code, 0);
  for (const char* s : {"--prompt-embeds", "--init-latents", "\"prompt_embeds\" [L, text_dim]", "\"latents\" [16",
                        "--json FILE", "130", "--gemm G", "--precision P"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
  r = run_wan({"--help"});
  EXPECT_EQ(r.code, 0);
  for (const char* s : {"generate", "encode-prompt", "decode"}) EXPECT_NE(r.out.find(s), std::string::npos) << s;
  EXPECT_EQ(run_wan({"decode", "--help"}).code, 0);
  EXPECT_EQ(run_wan({"encode-prompt", "--help"}).code, 0);
}
