// Small pieces shared by the `wan bench*` commands (cmd_bench*.cpp).
#pragma once
#include <string>

namespace wan::cli {

// The current UTC time as ISO 8601 ("2026-11-21T05:30:00Z"), the `date` field of the bench JSONs.
std::string utc_now();

}  // namespace wan::cli
