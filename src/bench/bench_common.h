// Small pieces shared by the `wan bench*` commands (cmd_bench*.cpp): the JSON result file and the
// option rows every bench command has (--device, --json), so they read and check alike.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "api/options.h"

namespace wan::cli {

// The current UTC time as ISO 8601 ("2026-11-21T05:30:00Z"), the `date` field of the bench JSONs.
std::string utc_now();

// Writes j (indented) to path and prints "wrote <path>"; one wan::Error naming --json and the path when the
// file cannot be opened or written.
void write_json_file(const std::string& path, const nlohmann::json& j);

// --device cuda[:i] (a bare index i means cuda:i; cpu is refused: the benches time GPU work).
api::Option bench_device_option();
// --json FILE: the results as JSON.
api::Option bench_json_option();
// An integer row with an inclusive range (the bench tables have many).
api::Option bench_int_option(const std::string& name, const std::string& def, double min, double max,
                             const std::string& help, const std::string& meta = "N");

}  // namespace wan::cli
