// `wan bench`'s command line (the step benchmark of cmd_bench.cpp): options, help text and checks.
#include <string>

#include "api/commands.h"
#include "bench/bench_common.h"
#include "bench/commands.h"
#include "core/error.h"
#include "models/config.h"

namespace wan::cli {

const api::CommandSpec& bench_spec() {
  static const api::CommandSpec s = [] {
    using api::Kind;
    using api::Option;
    api::CommandSpec c;
    c.name = "bench";
    c.summary = "time DiT denoising steps on the GPU with random weights (s/step, breakdown)";
    c.usage = {"bench [options]", "bench --load PATH [options]   (the load benchmark: see 'wan help bench-load')"};
    c.about = "Times DiT denoising steps on the GPU with random weights at the real width (batch 2: CFG).";
    api::Option task =
        api::option("task", Kind::String, "NAME", "t2v-A14B", "t2v-A14B | i2v-A14B | ti2v-5B (config preset)");
    task.check = [](const std::string& t) -> std::string {
      try {
        (void)task_from_name(t);
        return "";
      } catch (const Error& e) {
        return cat("{}: ", e.what());
      }
    };
    Option frames = bench_int_option("frames", "81, ti2v-5B 121", 1, 1e6, "pixel frames, 4n+1");
    frames.check = [](const std::string& f) {
      return (std::stoll(f) - 1) % 4 == 0 ? std::string() : cat("{} ", f, ": must be 4n+1");
    };
    api::Option attention = api::option("attention", Kind::Enum, "K", "auto",
                                        "auto (the engine's own kernel on sm_90, cuDNN elsewhere) | own | cudnn | "
                                        "own-fp8 (e4m3, opt-in; --precision fp8 picks it)");
    attention.choices = {"auto", "own", "cudnn", "own-fp8"};
    Option profile = bench_int_option("profile-reps", "2", 0, 100,
                                      "eager forwards of the step with events around every GEMM and attention after "
                                      "the timed steps (median; 0: no in-step breakdown; one GPU)");
    profile.range_note = "0: no in-step breakdown";
    Option warmup =
        bench_int_option("warmup", "2", 1, 100, "untimed forwards first (eager plan building, graph capture)");
    warmup.range_note = "the first forward builds plans";
    Option seed = bench_int_option("seed", "0", 0, 9.2e18, "weight and input seed");
    api::Option gpus =
        api::option("gpus", Kind::String, "N", "",
                    "run the step on these GPUs (no per-op breakdown): one thread per GPU, or one process per "
                    "GPU under mpirun / srun / WAN_RANK");
    gpus.synopsis = "--gpus N | --devices 0,1,...";
    api::Option devices = api::option("devices", Kind::String, "0,1,...", "", "");
    devices.hidden = true;  // documented in the --gpus row
    c.options = {
        task,
        api::option("size", Kind::Size, "", "1280x720, ti2v-5B 1280x704",
                    "pixel size (multiples of 16, ti2v-5B 32: its VAE strides 16)"),
        frames,
        api::option("layers", Kind::String, "N[,M...]", "the preset's: 40, ti2v-5B 30",
                    "blocks to build. Fewer: the full-depth step is extrapolated (two counts: (t_b - t_a)/(b - a) "
                    "x the preset's layers)"),
        bench_int_option("steps", "3", 1, 1000, "timed forwards per layer count"),
        warmup,
        bench_int_option("batch", "2", 1, 64, "samples per forward"),
        api::option("distinct-latents", Kind::Flag, "", "",
                    "one random latent per sample; default: one latent for all samples, as the samplers' CFG "
                    "steps run (the first block's self-attention then runs once)"),
        api::option("uniform-t", Kind::Flag, "", "",
                    "ti2v-5B: one timestep for every token (its text mode); default: its image mode's per-token "
                    "timesteps, latent frame 0's tokens at 0 and the rest at t (other tasks: always one)"),
        seed,
        api::option("no-graphs", Kind::Flag, "", "", "eager forwards instead of CUDA-graph replay"),
        api::option("no-breakdown", Kind::Flag, "", "",
                    "skip the per-op breakdown (it needs an activation arena of its own)"),
        bench_int_option("breakdown-reps", "3", 1, 100, "repetitions of the isolated op sequence (median)"),
        profile,
        bench_device_option(),
        attention,
        bench_json_option(),
        api::option("verbose", Kind::Flag, "", "", "print the memory plan"),
        api::option("error-vs-exact", Kind::Flag, "", "",
                    "then one forward at the preset's depth in this precision and one exact (bf16 GEMMs and "
                    "attention), same weights and inputs: their relative L2 distance (one GPU)"),
        api::option("load", Kind::Path, "PATH", "",
                    "time loading the checkpoint at PATH to the GPU instead (start-up: page-cache read, H2D, "
                    "file to GPU weights); its options: 'wan help bench-load'"),
        gpus,
        devices,
        api::option("cfg-parallel", Kind::Flag, "", "", "cond and uncond on two halves of the GPUs"),
        api::option("ulysses", Kind::Int, "U", "", "all-to-all sequence parallel over U GPUs (U divides the heads)"),
        api::option("ring", Kind::Int, "R", "",
                    "ring attention over R GPUs (Ulysses inside, ring across). None of the three: automatic (cfg "
                    "first, then Ulysses, then ring)"),
    };
    api::add_gemm_rows(c.options);
    api::add_memory_budget_rows(c.options);
    return c;
  }();
  return s;
}

}  // namespace wan::cli
