// Output files (see output_file.h): target resolution, unique temporary names, commit by rename.
// Invariant: the temporary file is created with O_EXCL and mode 0666 (the kernel applies the umask), so
// it is always a fresh file of this process, and it is either renamed over the target or unlinked.
#include "formats/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <system_error>

#include "core/error.h"

namespace wan {
namespace {

namespace fs = std::filesystem;

// Six letters or digits. Seeded per thread from the system's entropy, the clock and the thread, so
// concurrent writers (PNG frames, two processes) draw different names; O_EXCL settles any clash.
std::string random_tag() {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng([] {
    std::random_device rd;
    const uint64_t t = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    std::seed_seq seq{rd(), rd(), static_cast<unsigned>(t), static_cast<unsigned>(t >> 32),
                      static_cast<unsigned>(::getpid())};
    return std::mt19937_64(seq);
  }());
  std::string s(6, 'x');
  for (char& c : s) c = kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
  return s;
}

std::string folder_of(const fs::path& p) {
  const fs::path d = p.parent_path();
  return d.empty() ? "." : d.string();
}

}  // namespace

std::string resolve_output_target(const std::string& path, const std::string& who) {
  WAN_CHECK(!path.empty(), who, ": empty file name");
  std::error_code ec;
  const fs::path p(path);
  const fs::file_status link = fs::symlink_status(p, ec);
  const fs::file_status st = fs::status(p, ec);
  WAN_CHECK(!fs::is_directory(st), who, ": is a folder, expected a file name");
  const std::string name = p.filename().string();
  WAN_CHECK(!name.empty() && name != "." && name != "..", who, ": no file name");
  const std::string dir = folder_of(p);
  const fs::file_status dst = fs::status(dir, ec);
  WAN_CHECK(fs::exists(dst), who, ": folder '", dir, "' does not exist");
  WAN_CHECK(fs::is_directory(dst), who, ": '", dir, "' is not a folder");
  if (fs::is_symlink(link)) {
    // Written through: the file the link points to is replaced, the link stays a link.
    const fs::path to = fs::read_symlink(p, ec);
    WAN_CHECK(fs::exists(st), who, ": is a symbolic link to '", to.string(), "', which does not exist");
    const fs::path target = fs::canonical(p, ec);
    WAN_CHECK(!ec, who, ": cannot resolve the symbolic link: ", ec.message());
    WAN_CHECK(fs::is_regular_file(st), who, ": is a symbolic link to '", target.string(),
              "', which is not a regular file");
    return target.string();
  }
  WAN_CHECK(!fs::exists(st) || fs::is_regular_file(st), who,
            ": exists and is not a regular file (a device, pipe or socket)");
  return path;
}

void check_output_writable(const std::string& path, const std::string& who) {
  OutputFile probe(path, who);
  probe.discard();
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ea, eb;
  const fs::path ca = fs::weakly_canonical(a, ea), cb = fs::weakly_canonical(b, eb);
  if (!ea && !eb && ca == cb) return true;
  struct stat sa {}, sb {};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

OutputFile::OutputFile(const std::string& path, const std::string& who) : who_(who), path_(path) {
  target_ = resolve_output_target(path, who);
  const fs::path t(target_);
  std::string name = t.filename().string();
  if (name.size() > 200) name.resize(200);  // the name plus 13 characters must stay within NAME_MAX (255)
  const fs::path dir = t.parent_path();
  for (int attempt = 0;; ++attempt) {
    const std::string cand = (dir / ("." + name + "." + random_tag() + ".tmp")).string();
    fd_ = ::open(cand.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ >= 0) {
      temp_ = cand;
      return;
    }
    if (errno == EEXIST && attempt < 100) continue;
    const int err = errno;
    WAN_THROW(who, ": cannot create a file in folder '", folder_of(t), "': ", std::strerror(err));
  }
}

OutputFile::~OutputFile() { discard(); }

void OutputFile::write(const void* data, size_t n) {
  WAN_ASSERT(fd_ >= 0 && !committed_, "write to a finished output");
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));  // one call caps near 2 GiB
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = w < 0 ? errno : EIO;
      WAN_THROW(who_, ": write failed", err == ENOSPC ? " (disk full)" : "", ": ", std::strerror(err));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void OutputFile::finish() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  // Durable before the rename, so a crash leaves the old file or the complete new one.
  int err = ::fsync(fd) == 0 ? 0 : errno;
  struct stat st {};
  if (err == 0 && ::stat(target_.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::fchmod(fd, st.st_mode & 0777) != 0)
    err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  WAN_CHECK(err == 0, who_, ": finishing the file failed", err == ENOSPC ? " (disk full)" : "", ": ",
            std::strerror(err));
}

void OutputFile::commit() {
  WAN_ASSERT(!committed_ && !temp_.empty(), "commit of a discarded output");
  finish();
  if (::rename(temp_.c_str(), target_.c_str()) != 0) {
    const int err = errno;
    discard();
    WAN_THROW(who_, ": cannot rename the finished temporary file over '", target_, "': ", std::strerror(err));
  }
  committed_ = true;
}

void OutputFile::discard() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!committed_ && !temp_.empty()) ::unlink(temp_.c_str());
  temp_.clear();
}

}  // namespace wan
