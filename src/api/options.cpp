// The option tables: argv and JSON parsing, validation and the generated help (see options.h).
// Every check goes through validate(), so a command line and a JSON request accept the same values.
#include "api/options.h"

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "core/printable.h"

namespace wan::api {
namespace {

constexpr size_t kHelpWidth = 108;  // the widest help line
constexpr size_t kHelpColumn = 28;  // where an option's description starts

std::string num(double v) {
  if (std::floor(v) == v && std::fabs(v) < 1e15) return std::to_string(static_cast<long long>(v));
  std::ostringstream os;
  os << v;
  return os.str();
}

bool to_int(const std::string& s, long long* v) {
  errno = 0;
  char* end = nullptr;
  *v = std::strtoll(s.c_str(), &end, 10);
  return errno == 0 && end && *end == 0 && !s.empty();
}

std::string hex_byte(char c) {
  static const char kDigits[] = "0123456789ABCDEF";
  const auto b = static_cast<unsigned char>(c);
  return {kDigits[b >> 4], kDigits[b & 15]};
}

bool to_double(const std::string& s, double* v) {
  errno = 0;
  char* end = nullptr;
  *v = std::strtod(s.c_str(), &end);
  return errno == 0 && end && *end == 0 && !s.empty();
}

int positive_int(const std::string& s, const std::string& key, const char* part) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos || std::stoi(s) <= 0)
    throw OptionError(key, cat("{} ", part, ": '", s, "' is not a positive integer"));
  return std::stoi(s);
}

float finite_float(const std::string& s, const std::string& key, const char* part) {
  char* end = nullptr;
  errno = 0;
  const float v = std::strtof(s.c_str(), &end);
  if (s.empty() || !end || *end != 0) throw OptionError(key, cat("{}", part, ": '", s, "' is not a number"));
  if (errno != 0 || !std::isfinite(v))
    throw OptionError(key, cat("{}", part, ": '", s, "' must be a finite number"));
  return v;
}

void check_range(const Option& o, const std::string& text, double v) {
  const bool low = o.min && v < *o.min, high = o.max && v > *o.max;
  if (!low && !high && !std::isnan(v)) return;
  std::string want = o.min && o.max ? cat("expected ", num(*o.min), "..", num(*o.max))
                     : o.min        ? cat("must be >= ", num(*o.min))
                                    : cat("must be <= ", num(*o.max));
  if (!o.range_note.empty()) want += " (" + o.range_note + ")";
  throw OptionError(o.name, cat("{} ", text, ": ", want));
}

std::string kind_meta(const Option& o) {
  if (!o.meta.empty()) return o.meta;
  switch (o.kind) {
    case Kind::Flag:
      return "";
    case Kind::Int:
      return "N";
    case Kind::Float:
      return "X";
    case Kind::Size:
      return "WxH";
    case Kind::Path:
      return "FILE";
    case Kind::Device:
      return "DEV";
    case Kind::List:
      return "A,B,...";
    case Kind::Enum: {
      std::string s;
      for (const std::string& c : o.choices) s += (s.empty() ? "" : "|") + c;
      return s;
    }
    case Kind::String:
      return "TEXT";
  }
  return "";
}

std::string json_text(const Option& o, const nlohmann::json& v) {
  const auto bad = [&](const char* want) {
    return OptionError(o.name, cat("{}: expected ", want, ", got ", v.dump()));
  };
  switch (o.kind) {
    case Kind::Flag:
      throw bad("a boolean");  // handled by the caller
    case Kind::Int:
      if (!v.is_number_integer()) throw bad("an integer");
      return std::to_string(v.get<long long>());
    case Kind::Float: {
      if (!v.is_number()) throw bad("a number");
      std::ostringstream os;
      os.precision(17);
      os << v.get<double>();
      return os.str();
    }
    case Kind::List:
      if (v.is_array()) {
        std::string s;
        for (const auto& e : v) {
          if (!e.is_string() && !e.is_number()) throw bad("an array of strings or numbers");
          s += (s.empty() ? "" : ",") + (e.is_string() ? e.get<std::string>() : e.dump());
        }
        return s;
      }
      [[fallthrough]];
    default:
      if (v.is_string()) return v.get<std::string>();
      if (o.kind == Kind::Device && v.is_number_integer() && o.gpu_index) return v.dump();
      throw bad("a string");
  }
}

}  // namespace

Option option(std::string name, Kind kind, std::string meta, std::string def, std::string help) {
  Option o;
  o.name = std::move(name);
  o.kind = kind;
  o.meta = std::move(meta);
  o.def = std::move(def);
  o.help = std::move(help);
  return o;
}

Option flag_option(std::string name, std::string help) {
  return option(std::move(name), Kind::Flag, "", "", std::move(help));
}

const Option* find_option(const CommandSpec& spec, const std::string& name) {
  for (const Option& o : spec.options) {
    if (o.name == name) return &o;
    for (const std::string& a : o.aliases)
      if (a == name) return &o;
  }
  return nullptr;
}

void validate(const Option& o, const std::string& text) {
  switch (o.kind) {
    case Kind::Int: {
      long long v = 0;
      if (!to_int(text, &v)) throw OptionError(o.name, cat("option {}: '", text, "' is not an integer"));
      check_range(o, text, static_cast<double>(v));
      break;
    }
    case Kind::Float: {
      double v = 0;
      if (!to_double(text, &v)) throw OptionError(o.name, cat("option {}: '", text, "' is not a number"));
      if (!std::isfinite(v)) throw OptionError(o.name, cat("option {}: '", text, "' must be a finite number"));
      if (o.min || o.max) check_range(o, text, v);
      break;
    }
    case Kind::Enum: {
      bool ok = false;
      std::string valid;
      for (const std::string& c : o.choices) {
        ok = ok || c == text;
        valid += (valid.empty() ? "" : ", ") + c;
      }
      if (!ok) throw OptionError(o.name, cat("unknown {} '", text, "' (valid: ", valid, ")"));
      break;
    }
    case Kind::Size:
      (void)parse_size(text, o.name);
      break;
    case Kind::Device:
      (void)parse_device(text, o.name, o.gpu_index);
      break;
    case Kind::String: {
      // Text reaches the tokenizer, files and messages: refuse what is not UTF-8 rather than guess.
      // (Paths are bytes to the OS and may be anything.)
      const size_t bad = first_invalid_utf8(text);
      if (bad != std::string::npos)
        throw OptionError(o.name, cat("option {}: not valid UTF-8 (byte 0x", hex_byte(text[bad]), " at offset ", bad,
                                      " of \"", printable(text, 40), "\")"));
      break;
    }
    default:
      break;
  }
  if (o.check) {
    const std::string problem = o.check(text);
    if (!problem.empty()) throw OptionError(o.name, problem);
  }
}

// ---- Values ----

const Option& Values::row(const std::string& name) const {
  const Option* o = find_option(*spec_, name);
  WAN_ASSERT(o != nullptr && o->name == name, spec_->name, ": no option row '", name, "'");
  return *o;
}

bool Values::flag(const std::string& name) const {
  WAN_ASSERT(row(name).kind == Kind::Flag, "--", name, " is not a flag");
  return has(name);
}

std::optional<std::string> Values::get(const std::string& name) const {
  (void)row(name);
  const auto it = given_.find(name);
  if (it == given_.end()) return std::nullopt;
  return it->second;
}

std::string Values::get_or(const std::string& name, const std::string& def) const { return get(name).value_or(def); }

std::string Values::str(const std::string& name) const { return get(name).value_or(row(name).def); }

std::string Values::require(const std::string& name) const {
  const auto v = get(name);
  if (!v) throw OptionError(name, "missing required option {}");
  return *v;
}

long long Values::get_int(const std::string& name, long long def) const {
  const auto v = get(name);
  if (!v) return def;
  long long r = 0;
  if (!to_int(*v, &r)) throw OptionError(name, cat("option {}: '", *v, "' is not an integer"));
  return r;
}

double Values::get_double(const std::string& name, double def) const {
  const auto v = get(name);
  if (!v) return def;
  double r = 0;
  if (!to_double(*v, &r)) throw OptionError(name, cat("option {}: '", *v, "' is not a number"));
  return r;
}

std::pair<int, int> Values::size(const std::string& name) const {
  const Size s = parse_size(str(name), name);
  return {s.width, s.height};
}

int Values::device(const std::string& name) const { return parse_device(str(name), name, row(name).gpu_index); }

std::vector<std::string> Values::list(const std::string& name) const {
  std::vector<std::string> out;
  std::stringstream ss(str(name));
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

std::vector<std::string> Values::all(const std::string& name) const {
  (void)row(name);
  auto it = repeated_.find(name);
  if (it != repeated_.end()) return it->second;
  auto g = given_.find(name);
  return g == given_.end() ? std::vector<std::string>{} : std::vector<std::string>{g->second};
}

// ---- parsing ----

Values parse_argv(const CommandSpec& spec, int argc, char** argv) {
  Values v(spec);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      v.set_help();
      continue;
    }
    if (a.rfind("--", 0) != 0 || a == "--") {
      WAN_CHECK(static_cast<int>(v.positional().size()) < spec.max_positional, "unexpected argument '", a,
                "' (options start with --; see --help)");
      v.add_positional(a);
      continue;
    }
    std::string name = a.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const Option* o = find_option(spec, name);
    WAN_CHECK(o != nullptr, "unknown option --", name, " (see 'wan ", spec.name, " --help')");
    if (o->kind == Kind::Flag) {
      if (inline_value) throw OptionError(o->name, "option {} takes no value");
      v.set(o->name, "");
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= argc) throw OptionError(o->name, "option {} needs a value");
      // "--prompt --output o.y4m": the value was forgotten, not meant to be "--output" (a value that
      // starts with an option's name is given as --prompt=--output).
      const std::string next = argv[i + 1];
      if (next == "-h" || next == "--help" || (next.rfind("--", 0) == 0 && find_option(spec, next.substr(2, next.find('=') - 2))))
        throw OptionError(o->name, cat("option {} needs a value, but the next argument is the option ", next,
                                       " (write {}=VALUE for a value that starts with --)"));
      value = argv[++i];
    }
    validate(*o, value);
    if (o->repeatable) v.append(o->name, value);
    else v.set(o->name, value);
  }
  if (!v.help())
    for (const Option& o : spec.options)
      if (o.required) (void)v.require(o.name);
  return v;
}

Values parse_json(const CommandSpec& spec, const nlohmann::json& j) {
  WAN_CHECK(j.is_object(), spec.name, ": the request must be a JSON object, got ", j.type_name());
  Values v(spec);
  try {
    for (const auto& [key, val] : j.items()) {
      const Option* o = find_option(spec, key);
      WAN_CHECK(o != nullptr, "unknown param '", key, "' for ", spec.name);
      if (o->kind == Kind::Flag) {
        if (!val.is_boolean()) throw OptionError(o->name, cat("{}: expected a boolean, got ", val.dump()));
        if (val.get<bool>()) v.set(o->name, "");
        continue;
      }
      if (o->repeatable && val.is_array()) {
        for (const auto& item : val) {
          if (!item.is_string()) throw OptionError(o->name, cat("{}: expected strings, got ", item.dump()));
          validate(*o, item.get<std::string>());
          v.append(o->name, item.get<std::string>());
        }
        continue;
      }
      const std::string text = json_text(*o, val);
      validate(*o, text);
      if (o->repeatable) v.append(o->name, text);
      else v.set(o->name, text);
    }
    for (const Option& o : spec.options)
      if (o.required && !v.has(o.name)) throw OptionError(o.name, "missing required param {}");
  } catch (const OptionError& e) {
    throw Error(e.json_message());
  }
  return v;
}

std::string json_error_message(const CommandSpec& spec, const std::exception& e) {
  // printable(): the message quotes user text and must stay valid UTF-8 inside a JSON body.
  if (const auto* oe = dynamic_cast<const OptionError*>(&e)) return printable(oe->json_message());
  const std::string m = printable(e.what());
  if (m.rfind("--", 0) != 0) return m;
  size_t end = 2;
  while (end < m.size() && (std::isalnum(static_cast<unsigned char>(m[end])) || m[end] == '-')) ++end;
  const Option* o = find_option(spec, m.substr(2, end - 2));
  return o ? "'" + o->name + "'" + m.substr(end) : m;
}

// ---- help ----

std::string wrap(const std::string& text, size_t width, size_t indent) {
  std::string out, line;
  const std::string pad(indent, ' ');
  size_t col = indent;
  std::stringstream paragraphs(text);
  bool first_par = true;
  for (std::string par; std::getline(paragraphs, par, '\n');) {
    if (!first_par) {
      out += "\n" + pad;
      col = indent;
    }
    first_par = false;
    std::stringstream words(par);
    bool first = true;
    for (std::string w; words >> w;) {
      if (!first && col + 1 + w.size() > width) {
        out += "\n" + pad;
        col = indent;
      } else if (!first) {
        out += ' ';
        ++col;
      }
      out += w;
      col += w.size();
      first = false;
    }
  }
  return out;
}

std::string help_text(const CommandSpec& spec) {
  std::string s;
  for (size_t i = 0; i < spec.usage.size(); ++i) s += (i == 0 ? "usage: wan " : "       wan ") + spec.usage[i] + "\n";
  if (!spec.about.empty()) s += "  " + wrap(spec.about, kHelpWidth, 2) + "\n";
  s += "\noptions:\n";
  auto row = [&](std::string left, std::string help) {
    left = "  " + left;
    s += left.size() + 1 < kHelpColumn ? left + std::string(kHelpColumn - left.size(), ' ')
                                       : left + "\n" + std::string(kHelpColumn, ' ');
    s += wrap(help, kHelpWidth, kHelpColumn) + "\n";
  };
  for (const Option& o : spec.options) {
    if (o.hidden) continue;
    const std::string meta = kind_meta(o);
    std::string left = !o.synopsis.empty() ? o.synopsis : "--" + o.name + (meta.empty() ? "" : " " + meta);
    std::string help = o.help;
    if (!o.def.empty()) help += " (default: " + o.def + ")";
    if (o.required) help += " (required)";
    row(left, help);
  }
  row("-h, --help", "show this help");
  if (!spec.epilog.empty()) s += "\n" + spec.epilog + (spec.epilog.back() == '\n' ? "" : "\n");
  return s;
}

// ---- value parsers ----

Size parse_size(const std::string& s, const std::string& key) {
  const size_t sep = s.find_first_of("x*X");
  if (sep == std::string::npos)
    throw OptionError(key, cat("{}: '", s, "' is not WIDTHxHEIGHT (e.g. 1280x720 or 1280*720)"));
  return Size{positive_int(s.substr(0, sep), key, "width"), positive_int(s.substr(sep + 1), key, "height")};
}

std::pair<float, float> parse_guide_scale(const std::string& s, const std::string& key) {
  const size_t comma = s.find(',');
  if (comma == std::string::npos) {
    const float g = finite_float(s, key, "");
    return {g, g};
  }
  return {finite_float(s.substr(0, comma), key, " (low-noise value)"),
          finite_float(s.substr(comma + 1), key, " (high-noise value)")};
}

int parse_device(const std::string& s, const std::string& key, bool gpu_index) {
  if (s == "cpu") return -1;
  std::string digits;
  if (s == "cuda") return 0;
  if (s.rfind("cuda:", 0) == 0)
    digits = s.substr(5);
  else if (gpu_index)
    digits = s;
  if (!digits.empty() && digits.size() < 5 && digits.find_first_not_of("0123456789") == std::string::npos)
    return std::stoi(digits);
  throw OptionError(key, cat("{} '", s, "' is not cpu, cuda or cuda:<index>"));
}

bool print_help_if_asked(const Values& v, const CommandSpec& spec) {
  if (!v.help()) return false;
  std::fputs(help_text(spec).c_str(), stdout);
  return true;
}

}  // namespace wan::api
