// The helpers of bench_common.h shared by the `wan bench*` commands.
#include "bench/bench_common.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "pipeline/files.h"

#ifdef WAN_HAVE_CUDA
#include "bench/dit_bench_gpu.h"
#include "kernels/rng.h"
#endif

namespace wan::cli {

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

std::string bench_commit() {
  const char* commit = std::getenv("WAN_COMMIT");
  return commit ? commit : "unknown";
}

void put_tool_header(nlohmann::json& j, const std::string& tool) {
  j["tool"] = tool;
  j["commit"] = bench_commit();
  j["date"] = utc_now();
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void write_json_file(const std::string& path, const nlohmann::json& j) {
  WAN_WITH_CONTEXT("--json", write_text_file(path, j.dump(2) + "\n"));  // temporary file + rename
  printf("wrote %s\n", path.c_str());
}

}  // namespace wan::cli

namespace wan::cli {

api::Option bench_device_option() {
  api::Option o =
      api::option("device", api::Kind::Device, "cuda[:i]", "cuda:0", "the CUDA device (a bare index i is cuda:i)");
  o.gpu_index = true;
  o.check = [](const std::string& s) {
    return api::parse_device(s, "device", true) < 0 ? cat("{} ", s, ": the benchmarks run on a GPU") : std::string();
  };
  return o;
}

api::Option bench_json_option() {
  return api::option("json", api::Kind::Path, "FILE", "", "write the results as JSON (commit from $WAN_COMMIT)");
}

api::Option bench_int_option(const std::string& name, const std::string& def, double min, double max,
                             const std::string& help, const std::string& meta) {
  api::Option o = api::option(name, api::Kind::Int, meta, def, help);
  o.min = min;
  o.max = max;
  return o;
}

std::string default_step_size(const std::string& task) { return task == "ti2v-5B" ? "1280x704" : "1280x720"; }
long long default_step_frames(const std::string& task) { return task == "ti2v-5B" ? 121 : 81; }

StepGeometry step_geometry(const std::string& task, const DiTConfig& cfg, const std::string& size, long long frames) {
  StepGeometry g;
  const size_t x = size.find_first_of("x*");
  WAN_CHECK(x != std::string::npos, "--size '", size, "': expected WxH, e.g. 1280x720");
  char* end = nullptr;
  g.width = std::strtoll(size.c_str(), &end, 10);
  WAN_CHECK(end == size.c_str() + x, "--size '", size, "': expected WxH");
  g.height = std::strtoll(size.c_str() + x + 1, &end, 10);
  WAN_CHECK(*end == 0 && g.width > 0 && g.height > 0, "--size '", size, "': expected positive WxH");
  WAN_CHECK(frames >= 1 && (frames - 1) % 4 == 0, "--frames ", frames, ": must be 4n+1");
  g.frames = frames;
  const int64_t stride = task == "ti2v-5B" ? 16 : 8;
  const int64_t mult = stride * cfg.patch[1];
  WAN_CHECK(g.width % mult == 0 && g.height % mult == 0, "--size ", size, ": width and height must be multiples of ",
            mult, " for ", task);
  g.T = (frames - 1) / 4 + 1, g.H = g.height / stride, g.W = g.width / stride;
  g.first_frame_tokens = (g.H / cfg.patch[1]) * (g.W / cfg.patch[2]);
  g.tokens = (g.T / cfg.patch[0]) * g.first_frame_tokens;
  return g;
}

std::vector<int> parse_layer_counts(const std::string& s, int full) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long n = std::strtol(item.c_str(), &end, 10);
    WAN_CHECK(!item.empty() && *end == 0 && n >= 1 && n <= full, "--layers '", s, "': expected counts in 1..", full);
    v.push_back(static_cast<int>(n));
  }
  WAN_CHECK(!v.empty(), "--layers: empty list");
  return v;
}

#ifdef WAN_HAVE_CUDA
int select_bench_device(long long device, const std::string& none_visible) {
  WAN_CHECK(cuda::device_count() > 0, none_visible);
  const int dev = static_cast<int>(device);
  WAN_CHECK(dev < cuda::device_count(), "--device ", device, ": only ", cuda::device_count(), " device(s)");
  CUDA_CHECK(cudaSetDevice(dev));
  CUDA_CHECK(cudaFree(nullptr));
  return dev;
}

nlohmann::json bench_device_json(const cuda::BenchDevice& bd) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  return {{"name", bd.name},
          {"sm_count", bd.sm_count},
          {"memory_gib", bd.total_bytes / kGiB},
          {"driver", bd.driver_version},
          {"runtime", bd.runtime_version},
          {"cudnn", bd.cudnn_version}};
}
#endif  // WAN_HAVE_CUDA

}  // namespace wan::cli
