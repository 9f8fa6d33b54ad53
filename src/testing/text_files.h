// Small file-system helpers for the checkpoint generator: whole-file text writes that report
// failures as wan::Error naming the path.
#pragma once
#include <string>

namespace wan::gen {
// Writes content to path (created or truncated); throws wan::Error "<path>: cannot write: <reason>".
void write_text_file(const std::string& path, const std::string& content);
}  // namespace wan::gen
