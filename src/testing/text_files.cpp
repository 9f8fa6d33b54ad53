// Whole-file writes with checked errors (a full disk must not leave a silently truncated config).
#include "testing/text_files.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace wan::gen {

void write_text_file(const std::string& path, const std::string& content) {
  FILE* f = std::fopen(path.c_str(), "wb");
  WAN_CHECK(f != nullptr, path, ": cannot write: ", std::strerror(errno));
  size_t n = content.empty() ? 0 : std::fwrite(content.data(), 1, content.size(), f);
  int werr = (n != content.size()) ? errno : 0;
  int cerr = std::fclose(f) != 0 ? errno : 0;
  if (werr || cerr || n != content.size())
    WAN_THROW(path, ": cannot write: ", std::strerror(werr ? werr : (cerr ? cerr : EIO)));
}

}  // namespace wan::gen
