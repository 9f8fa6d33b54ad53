// A tiny option parser shared by the subcommands: "--name value", "--name=value" and flags.
// Unknown options and missing values are bad input (wan::Error), reported with the option's name.
#pragma once
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"

namespace wan::cli {

class Args {
 public:
  // value_opts: options taking a value; flag_opts: options without one. argv[0] is the command name.
  Args(int argc, char** argv, const std::set<std::string>& value_opts, const std::set<std::string>& flag_opts);
  bool flag(const std::string& name) const { return flags_.count(name) != 0; }
  std::optional<std::string> get(const std::string& name) const;
  std::string get_or(const std::string& name, const std::string& def) const;
  std::string require(const std::string& name) const;
  long long get_int(const std::string& name, long long def) const;
  double get_double(const std::string& name, double def) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> flags_;
  std::vector<std::string> positional_;
};

}  // namespace wan::cli
