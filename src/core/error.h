// Errors: one exception type that carries context up to the command line.
// Invariant: library code throws wan::Error (never exits, never prints); the CLI catches it at the
// edge, prints one line "error: <what>" and returns exit code 2 (bad input) or 1 (internal).
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace wan {

enum class ErrorKind { BadInput, Internal };

class Error : public std::runtime_error {
 public:
  explicit Error(std::string msg, ErrorKind kind = ErrorKind::BadInput)
      : std::runtime_error(std::move(msg)), kind_(kind) {}
  ErrorKind kind() const { return kind_; }
  // Returns a new error whose message is "<ctx>: <this message>" (context is prepended as the
  // exception travels outwards: "loading high_noise_model: file.safetensors: tensor x: ...").
  Error with_context(const std::string& ctx) const { return Error(ctx + ": " + what(), kind_); }

 private:
  ErrorKind kind_;
};

template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

// A bad value of one option, thrown by any layer: `key` is the option's name in the option tables
// (api/options.h: "frames"), and `text` holds "{}" where the option is named. what() is the command
// line's form ("--frames: must be 4n+1"); a JSON front end shows json_message() ("'frames': must be ...").
class OptionError : public Error {
 public:
  OptionError(std::string key, std::string text)
      : Error(fill(text, "--" + key)), key_(std::move(key)), text_(std::move(text)) {}
  const std::string& key() const { return key_; }
  std::string json_message() const { return fill(text_, "'" + key_ + "'"); }
  // Keeps the option's key (Error::with_context would slice it off): "<ctx>: --frames: ...".
  OptionError with_context(const std::string& ctx) const { return OptionError(key_, ctx + ": " + text_); }

 private:
  static std::string fill(std::string text, const std::string& who) {
    for (size_t p = text.find("{}"); p != std::string::npos; p = text.find("{}", p + who.size()))
      text.replace(p, 2, who);
    return text;
  }
  std::string key_, text_;
};

}  // namespace wan

#define WAN_THROW(...) throw ::wan::Error(::wan::cat(__VA_ARGS__))
#define WAN_THROW_INTERNAL(...) \
  throw ::wan::Error(::wan::cat(__VA_ARGS__, " (", __FILE__, ":", __LINE__, ")"), ::wan::ErrorKind::Internal)
// Checks a condition that depends on user input (files, arguments): failure is a BadInput error.
#define WAN_CHECK(cond, ...)                 \
  do {                                       \
    if (!(cond)) WAN_THROW(__VA_ARGS__);     \
  } while (0)
// The same for a condition on one option's value: the message names it as "{}" (see OptionError).
#define WAN_THROW_OPTION(key, ...) throw ::wan::OptionError(key, ::wan::cat(__VA_ARGS__))
#define WAN_CHECK_OPTION(key, cond, ...)             \
  do {                                               \
    if (!(cond)) WAN_THROW_OPTION(key, __VA_ARGS__); \
  } while (0)
// Checks an internal invariant: failure is a bug, reported with file and line.
#define WAN_ASSERT(cond, ...)                                                   \
  do {                                                                          \
    if (!(cond)) WAN_THROW_INTERNAL("internal check failed: " #cond ": ", ##__VA_ARGS__); \
  } while (0)
// Runs a statement and prepends context to any wan::Error it throws.
#define WAN_WITH_CONTEXT(ctx, stmt)                          \
  do {                                                       \
    try {                                                    \
      stmt;                                                  \
    } catch (const ::wan::OptionError& e_) {                 \
      throw e_.with_context(ctx);                            \
    } catch (const ::wan::Error& e_) {                       \
      throw e_.with_context(ctx);                            \
    }                                                        \
  } while (0)
