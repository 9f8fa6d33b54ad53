// Helpers shared by the CPU tests.
// TempDir: a fresh folder under the system temp dir (fs::temp_directory_path()), named
// wan_<tag>_XXXXXX by mkdtemp, so it is unique across processes and threads and never reuses a
// folder left behind by an earlier run. The destructor removes it recursively and never throws.
// Accessors: p (fs::path), str(), t / "name" and t.file("name") (a child path as a string),
// files() (every entry below it, relative, sorted).
// error_of(f): the message of the wan::Error that f throws, "(no error)" when it throws none.
// EnvGuard: set(k, v) / unset(k) environment variables for one scope; the old values (or their absence)
// come back when it ends, in reverse order.
// random_blob(n): n bytes from std::random_device.
#pragma once
#include <stdlib.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "core/error.h"

namespace wan::test {

struct TempDir {
  std::filesystem::path p;

  explicit TempDir(const std::string& tag = "test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / ("wan_" + tag + "_XXXXXX")).string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
    p = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(p, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string str() const { return p.string(); }
  std::string operator/(const std::string& name) const { return (p / name).string(); }
  std::string file(const std::string& name) const { return *this / name; }
  std::set<std::string> files() const {
    std::set<std::string> s;
    for (const auto& e : std::filesystem::recursive_directory_iterator(p))
      s.insert(std::filesystem::relative(e.path(), p).string());
    return s;
  }
};

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

struct EnvGuard {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  void set(const std::string& k, const std::string& v) {
    save(k);
    ::setenv(k.c_str(), v.c_str(), 1);
  }
  void unset(const std::string& k) {
    save(k);
    ::unsetenv(k.c_str());
  }
  EnvGuard() = default;
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;
  ~EnvGuard() {
    for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
      if (it->second)
        ::setenv(it->first.c_str(), it->second->c_str(), 1);
      else
        ::unsetenv(it->first.c_str());
    }
  }

 private:
  void save(const std::string& k) {
    const char* old = std::getenv(k.c_str());
    saved.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
  }
};

inline std::vector<uint8_t> random_blob(size_t n) {
  std::random_device rd;
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rd());
  return b;
}

}  // namespace wan::test
