// Output files: the one way every writer of the engine (safetensors, JSON and text, y4m, PNG, MP4)
// creates a file, and the checks the front ends run on output paths before any heavy work.
//
// Invariants:
//  - A file is written to a temporary file of its own in the target's folder,
//    ".<name>.<6 random letters>.tmp", created with O_EXCL (never an existing file: two runs never
//    share one, and a user's file is never touched), then fsync'ed and renamed over the target. The
//    target is always either its old content or the complete new one; the temporary file is removed on
//    every failure.
//  - A replaced file keeps its permission bits (rwx of user, group, others); a new file gets 0666 minus
//    the umask, as any file the process creates.
//  - A symlinked output writes to the file the link points to (the link itself stays); a dangling link,
//    a folder or anything but a regular file is refused.
//  - Errors are wan::Error with one line naming the output.
#pragma once
#include <cstddef>
#include <string>

namespace wan {

// The file that writing `path` replaces or creates: `path` itself, or for a symlink the file it finally
// points to. Refuses an empty path, a path without a file name, a folder, anything that exists but is
// not a regular file, a dangling symlink, and a missing parent folder (creating folders silently would
// hide typos). `who` starts every message and names the path ("--output o.mp4",
// "cannot write video 'o.mp4'").
std::string resolve_output_target(const std::string& path, const std::string& who);

// Proves now, before any heavy work, that `path` can be written: resolve_output_target, then a
// temporary file is created next to the target and removed again (nothing stays reserved, so a run
// killed later leaves nothing behind). A read-only folder fails here, in one line.
void check_output_writable(const std::string& path, const std::string& who);

// Whether two paths name the same file: equal once resolved (symlinks followed, "." and ".." folded),
// or the same device and inode (hard links). A path that does not exist matches only by name.
bool same_file(const std::string& a, const std::string& b);

// One output being written: owns its temporary file until commit().
class OutputFile {
 public:
  // Resolves `path` (resolve_output_target) and creates its temporary file; `who` as above.
  OutputFile(const std::string& path, const std::string& who);
  ~OutputFile();  // removes the temporary file unless committed
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  const std::string& path() const { return path_; }       // as given
  const std::string& target() const { return target_; }   // the file commit() replaces or creates
  const std::string& temp_path() const { return temp_; }  // for writers that open by name (MP4)

  // Writes all n bytes at the current offset; throws naming the output (a full disk says so).
  void write(const void* data, size_t n);
  // fsync, the permissions above, close; the temporary file stays until commit() or destruction (lets a
  // writer finish many files before renaming any, without holding a descriptor for each).
  void finish();
  // finish() if not yet done, then rename over the target.
  void commit();
  // Removes the temporary file now (what the destructor does without commit()).
  void discard();

 private:
  std::string who_, path_, target_, temp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace wan
