// Small pieces shared by the `wan bench*` commands (cmd_bench*.cpp): the JSON result file and its common
// fields, the option rows every bench command has (--device, --json), medians, the DiT step bench's
// pixel-to-latent geometry and layer list, and (with CUDA) the device selection, the device fields of the
// JSONs and a scoped device buffer, so the commands read and check alike.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/options.h"
#include "models/config.h"

#ifdef WAN_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/check.h"

namespace wan::cuda {
struct BenchDevice;
}
#endif

namespace wan::cli {

// The current UTC time as ISO 8601 ("2026-11-21T05:30:00Z"), the `date` field of the bench JSONs.
std::string utc_now();

// $WAN_COMMIT, or "unknown": the `commit` field of the bench JSONs.
std::string bench_commit();

// Sets `tool`, `commit` and `date`, the fields every `wan bench*` JSON has.
void put_tool_header(nlohmann::json& j, const std::string& tool);

// The median of v (the mean of the middle two for an even count); 0 for none.
double median_of(std::vector<double> v);

// Writes j (indented) to path and prints "wrote <path>"; one wan::Error naming --json and the path when the
// file cannot be opened or written.
void write_json_file(const std::string& path, const nlohmann::json& j);

// --device cuda[:i] (a bare index i means cuda:i; cpu is refused: the benches time GPU work).
api::Option bench_device_option();
// --json FILE: the results as JSON.
api::Option bench_json_option();
// An integer row with an inclusive range (the bench tables have many).
api::Option bench_int_option(const std::string& name, const std::string& def, double min, double max,
                             const std::string& help, const std::string& meta = "N");

// The DiT step bench (`wan bench`): a task's pixel size and frames as the latent and tokens its DiT sees.
struct StepGeometry {
  int64_t width = 0, height = 0, frames = 0;  // pixels
  int64_t T = 0, H = 0, W = 0;                // latent
  int64_t tokens = 0;                         // per sample
  int64_t first_frame_tokens = 0;             // the tokens of latent frame 0 (one patch frame)
};
// The size and frames a task is benchmarked at when not given: T2V / I2V A14B 1280x720, 81 frames;
// TI2V-5B 1280x704, 121 frames (its pipeline's default 720p shape).
std::string default_step_size(const std::string& task);
long long default_step_frames(const std::string& task);
// `size` "WxH"; the VAE's spatial stride is 8 for the A14B tasks (Wan 2.1 VAE) and 16 for ti2v-5B (Wan 2.2
// VAE), its temporal stride 4. One wan::Error naming --size / --frames for a size or count that does not fit.
StepGeometry step_geometry(const std::string& task, const DiTConfig& cfg, const std::string& size, long long frames);
// "1,3": layer counts in 1..full; one wan::Error naming --layers otherwise.
std::vector<int> parse_layer_counts(const std::string& s, int full);

#ifdef WAN_HAVE_CUDA
// Checks that a device is visible (else one error: `none_visible`) and that --device names one of them,
// makes it current and creates its context, so that later memory samples and timings exclude that.
int select_bench_device(long long device, const std::string& none_visible);

// The `device` object of the bench JSONs: name, sm_count, memory_gib, driver, runtime, cudnn.
nlohmann::json bench_device_json(const cuda::BenchDevice& bd);

// A device allocation freed on scope exit (an error in the middle of a measurement must not leak gigabytes).
template <typename T>
struct DevMem {
  T* p = nullptr;
  size_t n = 0;
  explicit DevMem(size_t count) : n(count) {
    if (n) CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
  }
  ~DevMem() {
    if (p) cudaFree(p);
  }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
};
#endif  // WAN_HAVE_CUDA

}  // namespace wan::cli
