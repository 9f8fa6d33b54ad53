// A checkpoint's weight files against the tensor tables of its configs, before any heavy work: every
// file's header and byte ranges are read (opening a store checks them), and each component's tensor
// set is compared with its table (DiT: the config's; text encoder and VAE: the configs inferred for
// them). `wan inspect` prints the reports; generate, decode and encode-prompt refuse a checkpoint whose
// components they could use have any problem, naming the first.
// Invariants: no tensor data is read; missing and mis-shaped tensors are problems anywhere; a DiT
// tensor outside the table (e.g. blocks.1.* under a num_layers 1 config) is one too, while extra
// tensors in a text encoder or VAE file (which the configs are inferred from), and source tensors no
// layout rule maps (e.g. another component bundled in one file), are listed but ignored.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ckpt/layout.h"
#include "models/config.h"

namespace wan {

struct ComponentReport {
  Role role = Role::Vae;
  std::string path;
  std::string format;        // "safetensors", "pth", "tokenizer folder", ...
  bool has_tensors = false;  // false: the tokenizer
  size_t tensors = 0;
  int64_t params = 0;
  std::map<std::string, size_t> dtypes;
  std::vector<std::string> missing;
  std::vector<std::string> unexpected;  // tensors the layout maps to model names outside the table
  std::vector<std::string> ignored;     // source tensors the layout maps to no model name (listed only)
  std::vector<std::string> mismatches;  // "name: [got], expected [want]"
  std::string table_error;              // the config (hence the table) could not be inferred from the file
  size_t problems() const {
    return missing.size() + mismatches.size() + (role_is_dit(role) ? unexpected.size() : 0) +
           (table_error.empty() ? 0 : 1);
  }
  // "" when none, else the first problem in one line ("missing tensor 'x'", ...).
  std::string first_problem() const;
};

// The text encoder's and the VAE's configs when the caller has inferred them already (a plan has):
// null ones are inferred from the files (another read of their headers).
struct KnownConfigs {
  const T5Config* t5 = nullptr;
  const VaeConfig* vae = nullptr;
};

// Opens component `c` of `info` (throws wan::Error naming the file when a header or byte range is
// bad) and compares its tensors with its table.
ComponentReport check_component(const CheckpointInfo& info, const Component& c, const KnownConfigs& known = {});

// check_component for every component whose role is in `roles` (every component when empty); throws
// one wan::Error naming the component and its first problem.
void validate_checkpoint(const CheckpointInfo& info, const std::vector<Role>& roles = {},
                         const KnownConfigs& known = {});

}  // namespace wan
