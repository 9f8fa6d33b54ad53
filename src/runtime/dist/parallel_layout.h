// Parallel layouts of the DiT forward: CFG-parallel x Ulysses x Ring over the ranks of a launch,
// which rank plays which part, and the automatic choice. Host-only (no CUDA, no NCCL), so the CLI can
// check options on any build.
//
// Rank layout: rank = (cfg rank·ring + ring rank)·ulysses + Ulysses rank. The Ulysses group is the
// `ulysses` consecutive ranks (the all-to-alls, the heaviest traffic, stay between neighbouring GPUs); the
// ring group takes one rank of each Ulysses group; the sequence group (ulysses·ring ranks) shares one
// sample; the two cfg halves are the first and last world/2 ranks. Sequence rank = ring rank·ulysses +
// Ulysses rank is the index of the rank's token slice (src/models/dit/dit_gpu.h, Options::Parallel).
//
// Invariants: a valid layout has cfg in {1, 2}, ulysses dividing the heads, and cfg·ulysses·ring = the
// world size; validate() names the first violated rule in one wan::Error.
#pragma once
#include <string>
#include <vector>

namespace wan::dist {

// The one parallel-layout type: the launcher, the pipeline and the DiT's memory plan and forward all take it.
struct Layout {
  int cfg = 1, ulysses = 1, ring = 1;
  int world() const { return cfg * ulysses * ring; }
  int seq() const { return ulysses * ring; }
  bool active() const { return world() > 1; }
  bool operator==(const Layout&) const = default;
};

struct RankCoords {
  int cfg = 0, ring = 0, ulysses = 0;
  int seq = 0;  // ring·ulysses-degree + ulysses: the token slice
};
RankCoords coords(const Layout& l, int rank);

// Throws wan::Error unless `l` runs on `gpus` ranks for a model of `heads` heads (cfg needs CFG on, i.e.
// a batch of 2).
void validate(const Layout& l, int gpus, int heads, bool cfg_available = true);

// The automatic choice for `gpus` ranks: CFG-parallel first (when available and gpus is even), then
// Ulysses up to the largest divisor of the heads that divides the remaining ranks, then ring for the rest.
Layout choose_layout(int gpus, int heads, bool cfg_available = true);

// From the command line: cfg_flag (--cfg-parallel), ulysses / ring (0 = not given). Nothing given: the
// automatic choice; some given: the rest filled so the product is `gpus` (Ulysses as in choose_layout
// when only the ring degree is missing the other way round). Validated.
Layout resolve_layout(int gpus, int heads, bool cfg_flag, int ulysses, int ring, bool cfg_available = true);

// Every valid layout for `gpus` ranks (cfg 1 before 2, then Ulysses ascending).
std::vector<Layout> valid_layouts(int gpus, int heads, bool cfg_available = true);

std::string describe(const Layout& l);  // "cfg 2 x ulysses 2 x ring 1"

}  // namespace wan::dist
