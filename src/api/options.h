// The option tables of the `wan` commands: one row per option (name, kind, default, help, validation).
// Every front end reads the same table: the CLI parses argv with it and prints its help, the HTTP
// server parses a JSON object with it. Invariants: a value that reaches Values has passed its row's
// validation, so the typed getters never fail on given values; every bad input is one OptionError
// (a wan::Error of kind BadInput) that names the option, rendered as "--name" on the command line and
// as 'name' in JSON; aliases are older spellings that parse like the name but are never documented.
#pragma once
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace wan::api {

enum class Kind { Flag, String, Path, Int, Float, Size, Enum, List, Device };

// An error about one option (wan::OptionError, core/error.h): any layer may throw it.
using wan::OptionError;

struct Option {
  std::string name;  // "size": --size on the command line, "size" in JSON
  Kind kind = Kind::String;
  std::string meta;  // help placeholder ("N", "WxH", "FILE"); empty: from the kind
  std::string def;   // default as text, printed in the help; empty: none
  std::string help;
  std::vector<std::string> choices;  // Enum: the allowed values
  std::optional<double> min, max;    // Int / Float: inclusive range
  std::string range_note;            // appended to a range error ("0: no in-step breakdown")
  // Further validation of the text: returns "" when fine, else the problem with "{}" for the option.
  std::function<std::string(const std::string&)> check;
  std::vector<std::string> aliases;  // older spellings that still parse (never in the help)
  bool required = false;
  // May be given several times; every value is kept in order (Values::all). On the command line each
  // occurrence is one value; in JSON an array of strings (or one string).
  bool repeatable = false;
  bool hidden = false;     // parsed but not listed (documented in another row)
  bool gpu_index = false;  // Device: a bare index N means cuda:N (bench commands)
  std::string synopsis;    // the help's left column when not "--name META"
};

// A row with the common fields set (the rest are set on the result).
Option option(std::string name, Kind kind, std::string meta, std::string def, std::string help);
Option flag_option(std::string name, std::string help);

struct CommandSpec {
  std::string name;                // "generate"
  std::string summary;             // the line in `wan --help`
  std::vector<std::string> usage;  // after "usage: wan "
  std::string about;               // text between the usage and the options
  std::vector<Option> options;     // -h / --help is implicit
  std::string epilog;              // text after the options
  int max_positional = 0;          // arguments without --
  std::string positional_name;     // "PATH": named in the error for too many
};

// What a command line or a JSON object gave, validated against its table.
class Values {
 public:
  explicit Values(const CommandSpec& spec) : spec_(&spec) {}
  bool help() const { return help_; }
  bool flag(const std::string& name) const;
  bool has(const std::string& name) const { return given_.count(name) != 0; }
  std::optional<std::string> get(const std::string& name) const;  // given only
  std::string get_or(const std::string& name, const std::string& def) const;
  std::string str(const std::string& name) const;  // given, else the table's default
  std::string require(const std::string& name) const;
  long long get_int(const std::string& name, long long def) const;
  double get_double(const std::string& name, double def) const;
  std::pair<int, int> size(const std::string& name) const;  // width, height (given or default)
  int device(const std::string& name) const;                // -1: cpu, else the CUDA index
  std::vector<std::string> list(const std::string& name) const;
  // Every value of a repeatable option, in the order given (empty when absent).
  std::vector<std::string> all(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }

  void set(const std::string& name, std::string text) { given_[name] = std::move(text); }
  void append(const std::string& name, std::string text) {
    given_[name] = text;
    repeated_[name].push_back(std::move(text));
  }
  void set_help() { help_ = true; }
  void add_positional(std::string a) { positional_.push_back(std::move(a)); }

 private:
  const Option& row(const std::string& name) const;
  const CommandSpec* spec_;
  std::map<std::string, std::string> given_;
  std::map<std::string, std::vector<std::string>> repeated_;
  std::vector<std::string> positional_;
  bool help_ = false;
};

// The row named `name` or one of its aliases; nullptr when none.
const Option* find_option(const CommandSpec& spec, const std::string& name);

// Validates one value's text against its row; throws OptionError.
void validate(const Option& o, const std::string& text);

// argv[0] is the command's name. "--name value", "--name=value", flags, -h / --help. Required options
// are checked unless help was asked for.
Values parse_argv(const CommandSpec& spec, int argc, char** argv);

// A JSON object against the same table: flags are booleans, Int / Float numbers, List an array or a
// comma-separated string, the rest strings. Errors are wan::Error with the JSON form of the message.
Values parse_json(const CommandSpec& spec, const nlohmann::json& j);

// The command's help: usage, about, the documented options (wrapped, defaults appended), epilog.
std::string help_text(const CommandSpec& spec);
// Prints help_text(spec) to stdout when `v` asked for it (-h / --help); the caller then exits 0.
bool print_help_if_asked(const Values& v, const CommandSpec& spec);

// An error from any layer as a JSON front end shows it: OptionError in its JSON form; a message that
// starts with "--name" of an option of `spec` gets that option named the JSON way.
std::string json_error_message(const CommandSpec& spec, const std::exception& e);

// Word-wraps `text` to `width` columns, continuation lines indented by `indent` (explicit newlines kept).
std::string wrap(const std::string& text, size_t width, size_t indent);

// ---- value parsers shared by the tables (they throw OptionError for `key`) ----

struct Size {
  int width = 0, height = 0;
};
// "1280x720" or "1280*720" (width first).
Size parse_size(const std::string& s, const std::string& key = "size");
// "G" (both experts) or "G_low,G_high".
std::pair<float, float> parse_guide_scale(const std::string& s, const std::string& key = "guide-scale");
// "cpu" -> -1, "cuda" -> 0, "cuda:i" -> i; with gpu_index also "i" -> i.
int parse_device(const std::string& s, const std::string& key = "device", bool gpu_index = false);

}  // namespace wan::api
