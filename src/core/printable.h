// Safe echoing of user text in messages and logs: whatever bytes a user passes (a prompt, a path, an
// option value) come back as valid UTF-8 without control characters, so one error stays one line and
// a JSON encoder never meets invalid UTF-8.
// Invariants: valid UTF-8 printable text passes unchanged; each invalid byte becomes "\xNN"; control
// characters become "\n", "\r", "\t" or "\xNN"; the output is always valid UTF-8.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace wan {

// Length of the valid UTF-8 sequence at s[i] (1..4), or 0 when the byte there does not start one
// (overlong forms, surrogates and code points above U+10FFFF are invalid).
size_t utf8_sequence_length(std::string_view s, size_t i);
// Offset of the first byte that is not part of valid UTF-8, or npos when all of `s` is valid.
size_t first_invalid_utf8(std::string_view s);
// `s` made printable as above; with max_chars > 0, at most that many characters then "...".
std::string printable(std::string_view s, size_t max_chars = 0);

}  // namespace wan
