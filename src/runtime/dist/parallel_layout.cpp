// Parallel layouts (see parallel_layout.h).
#include "runtime/dist/parallel_layout.h"

#include "core/error.h"

namespace wan::dist {

RankCoords coords(const Layout& l, int rank) {
  RankCoords c;
  c.ulysses = rank % l.ulysses;
  c.ring = (rank / l.ulysses) % l.ring;
  c.cfg = rank / (l.ulysses * l.ring);
  c.seq = c.ring * l.ulysses + c.ulysses;
  return c;
}

void validate(const Layout& l, int gpus, int heads, bool cfg_available) {
  WAN_CHECK(gpus >= 1, "parallel layout: ", gpus, " GPUs");
  WAN_CHECK(l.cfg == 1 || l.cfg == 2, "--cfg-parallel: degree ", l.cfg, " (it splits cond and uncond: 1 or 2)");
  WAN_CHECK(l.cfg == 1 || cfg_available, "--cfg-parallel needs classifier-free guidance (a batch of cond and uncond)");
  WAN_CHECK(l.ulysses >= 1 && l.ring >= 1, "--ulysses / --ring must be >= 1");
  WAN_CHECK(heads % l.ulysses == 0, "--ulysses ", l.ulysses, " does not divide the model's ", heads, " heads");
  WAN_CHECK(l.world() == gpus, "parallel layout ", describe(l), " needs ", l.world(), " GPUs, but ", gpus,
            " are used");
}

namespace {
// Largest divisor of `heads` that also divides `ranks` (>= 1).
int ulysses_for(int ranks, int heads) {
  int best = 1;
  for (int u = 1; u <= ranks; ++u)
    if (ranks % u == 0 && heads % u == 0) best = u;
  return best;
}
}  // namespace

Layout choose_layout(int gpus, int heads, bool cfg_available) {
  WAN_CHECK(gpus >= 1 && heads >= 1, "parallel layout: ", gpus, " GPUs, ", heads, " heads");
  Layout l;
  l.cfg = cfg_available && gpus % 2 == 0 ? 2 : 1;
  const int rem = gpus / l.cfg;
  l.ulysses = ulysses_for(rem, heads);
  l.ring = rem / l.ulysses;
  return l;
}

Layout resolve_layout(int gpus, int heads, bool cfg_flag, int ulysses, int ring, bool cfg_available) {
  WAN_CHECK(ulysses >= 0 && ring >= 0, "--ulysses / --ring must be >= 1");
  if (!cfg_flag && ulysses == 0 && ring == 0) return choose_layout(gpus, heads, cfg_available);
  Layout l;
  l.cfg = cfg_flag ? 2 : 1;
  WAN_CHECK(gpus % l.cfg == 0, "--cfg-parallel needs an even number of GPUs, got ", gpus);
  const int rem = gpus / l.cfg;
  if (ulysses > 0 && ring > 0) {
    l.ulysses = ulysses, l.ring = ring;
  } else if (ulysses > 0) {
    WAN_CHECK(rem % ulysses == 0, "--ulysses ", ulysses, " does not divide the ", rem, " GPUs per CFG half");
    l.ulysses = ulysses, l.ring = rem / ulysses;
  } else if (ring > 0) {
    WAN_CHECK(rem % ring == 0, "--ring ", ring, " does not divide the ", rem, " GPUs per CFG half");
    l.ring = ring, l.ulysses = rem / ring;
  } else {
    l.ulysses = ulysses_for(rem, heads);
    l.ring = rem / l.ulysses;
  }
  validate(l, gpus, heads, cfg_available);
  return l;
}

std::vector<Layout> valid_layouts(int gpus, int heads, bool cfg_available) {
  std::vector<Layout> v;
  for (int c = 1; c <= 2; ++c) {
    if (gpus % c != 0 || (c == 2 && !cfg_available)) continue;
    const int rem = gpus / c;
    for (int u = 1; u <= rem; ++u)
      if (rem % u == 0 && heads % u == 0) v.push_back({c, u, rem / u});
  }
  return v;
}

std::string describe(const Layout& l) {
  return cat("cfg ", l.cfg, " x ulysses ", l.ulysses, " x ring ", l.ring);
}

}  // namespace wan::dist
