// The run-level memory plan's arithmetic and its table / refusal text (see memory_plan.h).
#include "runtime/memory_plan.h"

#include <cstdio>

#include "core/error.h"

namespace wan {

namespace {
constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = kMiB * 1024.0;
}  // namespace

const char* run_stage_name(RunStage s) {
  switch (s) {
    case RunStage::Load: return "load";
    case RunStage::TextEncode: return "text encode";
    case RunStage::ImageEncode: return "image encode";
    case RunStage::Denoise: return "denoise";
    case RunStage::Decode: return "decode";
  }
  return "?";
}

std::string memory_str(size_t bytes) {
  char s[32];
  const double b = static_cast<double>(bytes);
  if (b < kGiB) std::snprintf(s, sizeof s, "%.0f MiB", b / kMiB);
  else std::snprintf(s, sizeof s, "%.2f GiB", b / kGiB);
  return s;
}

int64_t largest_fitting(int64_t hi, const std::function<bool(int64_t)>& fits) {
  if (hi < 1 || !fits(1)) return 0;
  int64_t lo = 1;  // fits(lo); fits(n) unknown for lo < n <= hi
  if (fits(hi)) return hi;
  while (hi - lo > 1) {  // fits(lo), !fits(hi)
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

void RunMemoryPlan::add(const std::string& device, const std::string& name, size_t bytes, StageSet stages) {
  WAN_ASSERT((stages & ~kAllStages) == 0, "memory plan: item ", name, " has unknown stages ", stages);
  for (Device& d : devices_)
    if (d.name == device) {
      d.items.push_back({name, bytes, stages});
      return;
    }
  devices_.push_back({device, {{name, bytes, stages}}});
}

const RunMemoryPlan::Device& RunMemoryPlan::find(const std::string& device) const {
  for (const Device& d : devices_)
    if (d.name == device) return d;
  WAN_THROW_INTERNAL("memory plan: no device '", device, "'");
}

size_t RunMemoryPlan::stage_peak(const std::string& device, RunStage s) const {
  size_t sum = 0;
  for (const Item& it : find(device).items)
    if (it.stages & stage_bit(s)) sum += it.bytes;
  return sum;
}

bool RunMemoryPlan::uses(const std::string& device, RunStage s) const {
  for (const Item& it : find(device).items)
    if (it.stages & stage_bit(s)) return true;
  return false;
}

RunStage RunMemoryPlan::peak_stage(const std::string& device) const {
  RunStage best = RunStage::Load;
  for (int i = 1; i < kRunStages; ++i) {
    const RunStage s = static_cast<RunStage>(i);
    if (stage_peak(device, s) > stage_peak(device, best)) best = s;
  }
  return best;
}

size_t RunMemoryPlan::peak(const std::string& device) const { return stage_peak(device, peak_stage(device)); }

std::string RunMemoryPlan::str() const {
  std::string s = cat("run memory plan", request.empty() ? std::string() : cat(" (", request, ")"), ":\n");
  char line[256];
  for (const Device& d : devices_) {
    std::snprintf(line, sizeof line, "  %-40s %10s", d.name.c_str(), "");
    s += line;
    for (int i = 0; i < kRunStages; ++i) {
      std::snprintf(line, sizeof line, " %12s", run_stage_name(static_cast<RunStage>(i)));
      s += line;
    }
    s += "\n";
    for (const Item& it : d.items) {
      std::snprintf(line, sizeof line, "  %-40s %10s", it.name.c_str(), memory_str(it.bytes).c_str());
      std::string row = line;
      for (int i = 0; i < kRunStages; ++i)
        row += (it.stages & stage_bit(static_cast<RunStage>(i))) ? "            x" : "             ";
      row.erase(row.find_last_not_of(' ') + 1);
      s += row + "\n";
    }
    std::snprintf(line, sizeof line, "  %-40s %10s", "stage peak", "");
    s += line;
    for (int i = 0; i < kRunStages; ++i) {
      const RunStage st = static_cast<RunStage>(i);
      std::snprintf(line, sizeof line, " %12s", uses(d.name, st) ? memory_str(stage_peak(d.name, st)).c_str() : "-");
      s += line;
    }
    s += cat("\n  peak on ", d.name, ": ", memory_str(peak(d.name)), " (", run_stage_name(peak_stage(d.name)), ")\n");
  }
  return s;
}

std::string RunMemoryPlan::refusal(const std::string& device, size_t free_bytes) const {
  const RunStage st = peak_stage(device);
  const size_t need = stage_peak(device, st);
  if (need <= free_bytes) return {};
  std::string parts;
  for (const Item& it : find(device).items)
    if ((it.stages & stage_bit(st)) && it.bytes > 0)
      parts += cat(parts.empty() ? "" : " + ", it.name, " ", memory_str(it.bytes));
  const std::string instead = what_fits ? what_fits(device, st, free_bytes) : std::string();
  return cat("device ", device, ": the run", request.empty() ? std::string() : cat(" (", request, ")"),
             " does not fit: its ", run_stage_name(st), " stage needs ", memory_str(need), " (", parts,
             ") but only ", memory_str(free_bytes), " is free", instead.empty() ? std::string() : cat("; ", instead));
}

void RunMemoryPlan::check(const std::string& device, size_t free_bytes) const {
  const std::string why = refusal(device, free_bytes);
  if (!why.empty()) throw Error(why);
}

void RunMemoryPlan::check(size_t free_bytes) const {
  WAN_ASSERT(devices_.size() == 1, "memory plan: check(free) on a plan of ", devices_.size(), " devices");
  check(devices_[0].name, free_bytes);
}

}  // namespace wan
