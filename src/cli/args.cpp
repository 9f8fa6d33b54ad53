#include "cli/args.h"

#include <cerrno>
#include <cstdlib>

namespace wan::cli {

Args::Args(int argc, char** argv, const std::set<std::string>& value_opts, const std::set<std::string>& flag_opts) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0 || a == "--") {
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (flag_opts.count(name)) {
      WAN_CHECK(!has_value, "option --", name, " takes no value");
      flags_.insert(name);
    } else if (value_opts.count(name)) {
      if (!has_value) {
        WAN_CHECK(i + 1 < argc, "option --", name, " needs a value");
        value = argv[++i];
      }
      values_[name] = value;
    } else {
      WAN_THROW("unknown option --", name, " (see --help)");
    }
  }
}

std::optional<std::string> Args::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}
std::string Args::get_or(const std::string& name, const std::string& def) const { return get(name).value_or(def); }
std::string Args::require(const std::string& name) const {
  auto v = get(name);
  WAN_CHECK(v.has_value(), "missing required option --", name);
  return *v;
}
long long Args::get_int(const std::string& name, long long def) const {
  auto v = get(name);
  if (!v) return def;
  errno = 0;
  char* end = nullptr;
  long long r = std::strtoll(v->c_str(), &end, 10);
  WAN_CHECK(errno == 0 && end && *end == 0 && !v->empty(), "option --", name, ": '", *v, "' is not an integer");
  return r;
}
double Args::get_double(const std::string& name, double def) const {
  auto v = get(name);
  if (!v) return def;
  errno = 0;
  char* end = nullptr;
  double r = std::strtod(v->c_str(), &end);
  WAN_CHECK(errno == 0 && end && *end == 0 && !v->empty(), "option --", name, ": '", *v, "' is not a number");
  return r;
}

}  // namespace wan::cli
