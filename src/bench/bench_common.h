// Small pieces shared by the `wan bench*` commands (cmd_bench*.cpp).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace wan::cli {

// The current UTC time as ISO 8601 ("2026-11-21T05:30:00Z"), the `date` field of the bench JSONs.
std::string utc_now();

// Writes j (indented) to path and prints "wrote <path>"; one wan::Error naming --json and the path when the
// file cannot be opened or written.
void write_json_file(const std::string& path, const nlohmann::json& j);

}  // namespace wan::cli
