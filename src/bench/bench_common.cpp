#include "bench/bench_common.h"

#include <cstdio>
#include <ctime>
#include <fstream>

#include "core/error.h"

namespace wan::cli {

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

void write_json_file(const std::string& path, const nlohmann::json& j) {
  std::ofstream f(path);
  WAN_CHECK(f.good(), "--json ", path, ": cannot open for writing");
  f << j.dump(2) << "\n";
  f.flush();
  WAN_CHECK(f.good(), "--json ", path, ": write failed");
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

}  // namespace wan::cli
