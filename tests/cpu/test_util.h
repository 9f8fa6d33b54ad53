// Helpers shared by the CPU tests.
// TempDir: a fresh folder under the system temp dir (fs::temp_directory_path()), named
// wan_<tag>_XXXXXX by mkdtemp, so it is unique across processes and threads and never reuses a
// folder left behind by an earlier run. The destructor removes it recursively and never throws.
// Accessors: p (fs::path), str(), t / "name" and t.file("name") (a child path as a string),
// files() (every entry below it, relative, sorted).
#pragma once
#include <stdlib.h>

#include <filesystem>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>

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

}  // namespace wan::test
