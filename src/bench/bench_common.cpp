// The helpers of bench_common.h shared by the `wan bench*` commands.
#include "bench/bench_common.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>

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
