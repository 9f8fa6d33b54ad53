// Parsing JSON from files a user gives (configs, indexes, tokenizer files): one nesting limit for all.
// The parser, dump() and every copy of a document recurse once per level, so a file nested 100000
// deep would overflow the stack; the engine's JSON files nest at most five levels.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/error.h"

namespace wan {

constexpr int kMaxJsonDepth = 32;

// `text` parsed, or one wan::Error "<what>: invalid JSON: ..." / "<what>: JSON nested deeper than 32 levels".
inline nlohmann::json parse_json_limited(std::string_view text, const std::string& what) {
  auto shallow = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    WAN_CHECK(depth < kMaxJsonDepth, what, ": JSON nested deeper than ", kMaxJsonDepth, " levels");
    return true;
  };
  try {
    return nlohmann::json::parse(text, shallow);
  } catch (const nlohmann::json::exception& e) {
    WAN_THROW(what, ": invalid JSON: ", e.what());
  }
}

}  // namespace wan
