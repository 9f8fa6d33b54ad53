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
