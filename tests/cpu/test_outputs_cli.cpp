// The output rules of the `wan` commands, run as a user runs them (the binary at WAN_BINARY, a child
// process per call, on the tiny checkpoint of tests/fixtures/pipeline):
//  - an output that cannot be written is refused at the start: exit 2, one line, within a second, even
//    for a run that would take much longer, and nothing is written;
//  - an output that is one of the run's input files (checkpoint files incl. the VAE and the tokenizer,
//    embeddings, initial latents, decode's latents, the resumed state; through a symlink or a hard link
//    too) is refused up front, and every input keeps its bytes;
//  - the latents are written before the decode: a video write that fails (a file-size limit in the
//    child, the path of a full disk) and a Ctrl-C during the decode both keep them;
//  - a PNG sequence into a folder that holds an earlier one is refused unless --overwrite-frames, which
//    removes the frames the new sequence does not reach.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include "core/error.h"
#include "formats/safetensors.h"
#include "run_util.h"

namespace fs = std::filesystem;

namespace {

const std::string kFix = std::string(WAN_FIXTURES) + "/pipeline";
const std::string kModel = kFix + "/model";

using wan::test::RunResult;
using wan::test::slurp;
using wan::test::TempDir;

RunResult run_wan(const std::vector<std::string>& args) { return wan::test::run_captured(WAN_BINARY, args); }

// The fixture's run from embeddings (4 steps, 64x48, 9 frames) on `model`.
std::vector<std::string> golden_args(const std::string& model, const std::string& out) {
  return {"generate", "--model", model, "--prompt-embeds", kFix + "/prompt_embeds.safetensors",
          "--negative-prompt-embeds", kFix + "/negative_prompt_embeds.safetensors", "--init-latents",
          kFix + "/init_latents.safetensors", "--steps", "4", "--schedule", "diffusers", "--guide-scale", "3,4",
          "--output", out};
}

std::vector<std::string> plus(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// args with option `opt` set to `value` (replaced when present, appended otherwise), or removed with
// its value when drop.
std::vector<std::string> with(std::vector<std::string> args, const std::string& opt, const std::string& value,
                              bool drop = false) {
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] != opt) continue;
    if (drop) args.erase(args.begin() + static_cast<long>(i), args.begin() + static_cast<long>(i) + 2);
    else args[i + 1] = value;
    return args;
  }
  return drop ? args : plus(args, {opt, value});
}

// Every file below `dir` with its bytes.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> m;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) m[e.path().string()] = slurp(e.path().string());
  return m;
}

void expect_one_line_error(const RunResult& r, const std::string& part) {
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(part), std::string::npos) << "stderr: " << r.err << "wanted: " << part;
}

// The child's side of a fork: becomes `wan args`.
[[noreturn]] void exec_wan(const std::vector<std::string>& args) {
  std::string bin = WAN_BINARY;
  std::vector<std::string> copy = args;
  std::vector<char*> argv{bin.data()};
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv(bin.c_str(), argv.data());
  _exit(127);
}

// Runs `wan args` with stdout to /dev/null and stderr read here; `on_err` sees stderr as it grows and
// returns true once it has sent its signal. Returns the exit code (128 + signal when killed) and stderr.
RunResult run_interrupting(const std::vector<std::string>& args,
                           const std::function<bool(pid_t, const std::string&)>& on_err) {
  int pipefd[2];
  EXPECT_EQ(pipe(pipefd), 0);
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    close(pipefd[0]);
    dup2(pipefd[1], 2);
    const int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    exec_wan(args);
  }
  close(pipefd[1]);
  RunResult r;
  bool sent = false;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(pipefd[0], buf, sizeof buf);
    if (n <= 0) break;
    r.err.append(buf, static_cast<size_t>(n));
    if (!sent) sent = on_err(pid, r.err);
  }
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// Runs `wan args` with the child's file-size limit at `bytes` (writes beyond it fail with EFBIG, as on a
// full disk; SIGXFSZ ignored, which exec keeps).
RunResult run_with_file_size_limit(const std::vector<std::string>& args, rlim_t bytes) {
  TempDir io("limit");
  const std::string err = io / "stderr";
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(e, 2);
    const int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim {};
    getrlimit(RLIMIT_FSIZE, &lim);
    lim.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &lim);
    exec_wan(args);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  RunResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.err = slurp(err);
  return r;
}

wan::Tensor load(const std::string& file, const std::string& name) {
  return wan::SafetensorsFile::open(file)->get(name).to_f32().clone();
}

}  // namespace

TEST(OutputsCli, UnwritableOutputsAreRefusedAtTheStart) {
  TempDir t;
  // A run of thousands of steps: refused in well under a second, before the plan is even printed. The
  // kernel refuses new files in /proc even for root; a read-only folder (chmod) where that binds.
  std::vector<std::string> ro = {"/proc"};
  if (geteuid() != 0) {
    fs::create_directories(t.p / "ro");
    fs::permissions(t.p / "ro", fs::perms(0555));
    ro.push_back(t / "ro");
  }
  auto slow = with(with(golden_args(kModel, t / "o.y4m"), "--init-latents", "", true), "--steps", "3000");
  slow = plus(slow, {"--size", "16x16", "--frames", "1", "--seed", "1"});
  for (const std::string& dir : ro) {
    SCOPED_TRACE(dir);
    const std::vector<std::vector<std::string>> cases = {
        with(with(slow, "--output", dir + "/o.mp4"), "--save-latents", t / "keep.safetensors"),
        with(slow, "--save-latents", dir + "/l.safetensors"),
        with(slow, "--json", dir + "/t.json"),
        with(slow, "--output", dir + "/o.png"),
        {"decode", "--model", kModel, "--latents", kFix + "/init_latents.safetensors", "--output", dir + "/d.y4m"},
        {"decode", "--model", kModel, "--latents", kFix + "/init_latents.safetensors", "--output", t / "d.y4m",
         "--json", dir + "/d.json"},
        {"encode-prompt", "--model", kModel, "--prompt", "x", "--output", dir + "/p.safetensors"},
        {"forward", "--model", kModel, "--size", "16x16", "--frames", "1", "--output", dir + "/f.safetensors"},
        {"bench", "--json", dir + "/b.json"},
        {"bench-vae", "--json", dir + "/b.json"},
    };
    for (const auto& args : cases) {
      const auto t0 = std::chrono::steady_clock::now();
      const RunResult r = run_wan(args);
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      expect_one_line_error(r, "cannot create a file in folder '" + dir + "'");
      EXPECT_LT(secs, 1.0) << args[args.size() - 1];
    }
    // The state of a paused run likewise.
    const auto stop = with(slow, "--output", "", true);
    const RunResult r = run_wan(plus(stop, {"--save-state", dir + "/s.safetensors", "--stop-after-steps", "1"}));
    expect_one_line_error(r, "--save-state " + dir + "/s.safetensors");
    // make-checkpoint creates its partial folder next to DIR before writing anything.
    expect_one_line_error(run_wan({"make-checkpoint", "--config", "tiny", "--layout", "official", "--output",
                                   dir + "/ck"}),
                          "cannot create folder");
  }
  if (geteuid() != 0) fs::permissions(t.p / "ro", fs::perms(0755));
  EXPECT_EQ(t.files(), geteuid() != 0 ? std::set<std::string>{"ro"} : std::set<std::string>{});
}

TEST(OutputsCli, OutputsNeverOverwriteInputs) {
  TempDir t;
  const std::string m = t / "model";
  fs::copy(kModel, m, fs::copy_options::recursive);
  fs::copy_file(kFix + "/init_latents.safetensors", t / "init.safetensors");
  fs::create_hard_link(m + "/transformer_2/diffusion_pytorch_model.safetensors", t / "hard.safetensors");
  fs::create_symlink(m + "/text_encoder/model.safetensors", t / "link.safetensors");
  // A paused run's state, to resume.
  const auto g = with(golden_args(m, t / "o.y4m"), "--output", "", true);
  ASSERT_EQ(run_wan(plus(g, {"--save-state", t / "s.safetensors", "--stop-after-steps", "2"})).code, 0);
  const auto before = snapshot(t.str());
  const auto full = golden_args(m, t / "o.y4m");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {plus(full, {"--save-latents", m + "/transformer/diffusion_pytorch_model.safetensors"}), "dit_high_noise"},
      {plus(full, {"--save-latents", m + "/vae/diffusion_pytorch_model.safetensors"}), "checkpoint's vae"},
      {plus(full, {"--json", m + "/tokenizer/spiece.model"}), "checkpoint's tokenizer"},
      {plus(full, {"--json", m + "/vae/../text_encoder/config.json"}), "checkpoint's text_encoder"},
      {plus(full, {"--save-latents", t / "hard.safetensors"}), "dit_low_noise"},
      {plus(full, {"--json", t / "link.safetensors"}), "text_encoder"},
      {plus(g, {"--save-state", m + "/vae/config.json", "--stop-after-steps", "2"}), "checkpoint's vae"},
      {plus(g, {"--resume", t / "s.safetensors", "--save-state", t / "s.safetensors", "--stop-after-steps", "3"}),
       "--resume"},
      {with(with(full, "--init-latents", t / "init.safetensors"), "--save-latents", t / "init.safetensors"),
       "--init-latents"},
      {with(full, "--save-latents", kFix + "/prompt_embeds.safetensors"), "--prompt-embeds"},
      {{"decode", "--model", m, "--latents", t / "init.safetensors", "--output", t / "d.y4m", "--json",
        t / "init.safetensors"},
       "--latents"},
      {{"decode", "--model", m, "--latents", t / "init.safetensors", "--output", t / "d.y4m", "--json",
        m + "/vae/config.json"},
       "checkpoint's vae"},
      {{"encode-prompt", "--model", m, "--prompt", "x", "--output", m + "/text_encoder/model.safetensors"},
       "text_encoder"},
      {{"forward", "--model", m, "--output", m + "/transformer/diffusion_pytorch_model.safetensors"}, "dit_high"},
  };
  for (const auto& [args, part] : cases) {
    std::string line;
    for (const auto& a : args) line += a + " ";
    SCOPED_TRACE(line);
    const RunResult r = run_wan(args);
    expect_one_line_error(r, part);
    EXPECT_NE(r.err.find("is an input of this run"), std::string::npos) << r.err;
    EXPECT_TRUE(snapshot(t.str()) == before) << "a file changed, appeared or went";
  }
}

TEST(OutputsCli, LatentsSurviveAFailedVideoWrite) {
  TempDir t;
  // Latents ~9 kB, the y4m video ~83 kB: with a 40 kB file-size limit only the video fails.
  const RunResult r = run_with_file_size_limit(
      plus(golden_args(kModel, t / "o.y4m"), {"--save-latents", t / "lat.safetensors", "--json", t / "t.json"}), 40000);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("cannot write video"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(std::strerror(EFBIG)), std::string::npos) << r.err;
  ASSERT_TRUE(fs::exists(t / "lat.safetensors")) << r.err;
  const wan::Tensor got = load(t / "lat.safetensors", "latents");
  const wan::Tensor want = load(kFix + "/expected.safetensors", "latents");
  ASSERT_EQ(got.shape(), want.shape());
  double d = 0, mx = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    d = std::max(d, static_cast<double>(std::fabs(got.f32()[i] - want.f32()[i])));
    mx = std::max(mx, static_cast<double>(std::fabs(want.f32()[i])));
  }
  EXPECT_LE(d / mx, 1e-4);
  EXPECT_EQ(t.files(), std::set<std::string>{"lat.safetensors"}) << "the video or its temporary file was left";
}

TEST(OutputsCli, CtrlCDuringTheDecodeKeepsTheLatents) {
  TempDir t;
  // 41 frames at 128x128: 11 latent frames, seconds of decoding; the signal goes as the VAE loads.
  auto args = with(with(golden_args(kModel, t / "o.y4m"), "--init-latents", "", true), "--steps", "1");
  args = plus(args, {"--size", "128x128", "--frames", "41", "--seed", "1", "--save-latents", t / "lat.safetensors"});
  const RunResult r = run_interrupting(args, [](pid_t pid, const std::string& err) {
    if (err.find("load VAE") == std::string::npos) return false;
    kill(pid, SIGINT);
    return true;
  });
  EXPECT_EQ(r.code, 130) << r.err;
  EXPECT_NE(r.err.find("interrupted: kept --save-latents"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("VAE decode: chunk 11/11"), std::string::npos) << "the decode ran to the end";
  EXPECT_EQ(t.files(), std::set<std::string>{"lat.safetensors"});
  const wan::Tensor lat = load(t / "lat.safetensors", "latents");
  EXPECT_EQ(lat.shape(), (wan::Shape{16, 11, 16, 16}));
}

TEST(OutputsCli, PngFramesOfAnEarlierSequenceNeedOverwriteFrames) {
  TempDir t;
  fs::create_directories(t.p / "frames");
  const std::string out = t / "frames/f.png";
  auto decode = [&](const std::string& latents, bool overwrite) {
    std::vector<std::string> a = {"decode", "--model", kModel, "--latents", latents, "--output", out, "--quiet"};
    if (overwrite) a.push_back("--overwrite-frames");
    return run_wan(a);
  };
  ASSERT_EQ(decode(kFix + "/init_latents.safetensors", false).code, 0);  // 9 frames
  EXPECT_TRUE(fs::exists(t / "frames/f_00008.png"));
  const auto nine = snapshot(t / "frames");
  ASSERT_EQ(nine.size(), 9u);
  // Two latent frames: 5 video frames. Refused without the option, nothing touched.
  const wan::Tensor init = load(kFix + "/init_latents.safetensors", "latents");
  wan::Tensor two = wan::Tensor::f32(wan::Shape{16, 2, init.dim(2), init.dim(3)});
  const int64_t plane = init.dim(2) * init.dim(3);
  for (int64_t c = 0; c < 16; ++c)
    std::memcpy(two.f32() + c * 2 * plane, init.f32() + c * init.dim(1) * plane, static_cast<size_t>(2 * plane) * 4);
  wan::write_safetensors(t / "two.safetensors", {{"latents", two}});
  expect_one_line_error(decode(t / "two.safetensors", false), "--overwrite-frames");
  EXPECT_TRUE(snapshot(t / "frames") == nine);
  // With it: five new frames, the four the new sequence does not reach are gone.
  const RunResult r = decode(t / "two.safetensors", true);
  ASSERT_EQ(r.code, 0) << r.err;
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(t / "frames")) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"f_00000.png", "f_00001.png", "f_00002.png", "f_00003.png", "f_00004.png"}));
  // (The causal VAE decodes the first latent frames alike, so the kept names may hold the same bytes.)
  EXPECT_TRUE(slurp(t / "frames/f_00004.png") == nine.at(t / "frames/f_00004.png"));
}
