// The run-level device memory plan: what each stage of a generation (load, text encode, denoise,
// decode) holds on each device, built from the per-model plans' plain numbers (the DiT's arena and
// weights, the text encoder's device bytes, the VAE's, the loader's staging, reserves), so that one
// check before any heavy work refuses a run that cannot fit, in one line that names what would.
// Invariants: pure host arithmetic on plain numbers (no device calls, no model headers); a stage's
// peak on a device is the sum of the items resident on it during that stage; a device's peak is its
// largest stage peak; check() throws one wan::Error (BadInput) exactly when a peak exceeds the free
// bytes given, naming the request, the failing stage's items, the free bytes and (through the
// caller's WhatFits) what would fit instead.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace wan {

enum class RunStage : uint8_t { Load, TextEncode, ImageEncode, Denoise, Decode };
constexpr int kRunStages = 5;
const char* run_stage_name(RunStage s);  // "load", "text encode", "image encode", "denoise", "decode"

// A set of stages, one bit per RunStage.
using StageSet = unsigned;
constexpr StageSet stage_bit(RunStage s) { return 1u << static_cast<unsigned>(s); }
constexpr StageSet kAllStages = (1u << kRunStages) - 1;

// "512 MiB" below 1 GiB, else "26.73 GiB" (binary units).
std::string memory_str(size_t bytes);

// The largest n in [1, hi] with fits(n), for fits true up to some n and false above (sizes grow with
// n); 0 when fits(1) is false. Binary search: O(log hi) calls.
int64_t largest_fitting(int64_t hi, const std::function<bool(int64_t)>& fits);

class RunMemoryPlan {
 public:
  struct Item {
    std::string name;     // what is resident: "expert high-noise: weights"
    size_t bytes = 0;
    StageSet stages = 0;  // the stages during which it is resident
  };
  struct Device {
    std::string name;     // "cuda:0"
    std::vector<Item> items;
  };
  // What would fit instead when `stage` on `device` needs more than `free_bytes` ("at most 41 frames
  // fit at 1280x720"); empty: nothing to add.
  using WhatFits = std::function<std::string(const std::string& device, RunStage stage, size_t free_bytes)>;

  // What was asked ("1280x720, 81 frames, 2 experts"), for str() and the refusal.
  std::string request;
  WhatFits what_fits;

  // Adds an item to `device` (created on first use, listed in that order).
  void add(const std::string& device, const std::string& name, size_t bytes, StageSet stages);
  const std::vector<Device>& devices() const { return devices_; }
  size_t stage_peak(const std::string& device, RunStage s) const;
  size_t peak(const std::string& device) const;
  RunStage peak_stage(const std::string& device) const;  // the first stage with the peak
  bool uses(const std::string& device, RunStage s) const; // anything resident in s

  // The table: one row per item (size, a mark per stage it is resident in), each stage's peak and the
  // device's peak, in MiB / GiB.
  std::string str() const;
  // "" when the peak of `device` fits free_bytes, else the one-line refusal check() throws.
  std::string refusal(const std::string& device, size_t free_bytes) const;
  void check(const std::string& device, size_t free_bytes) const;
  void check(size_t free_bytes) const;  // the plan's only device

 private:
  const Device& find(const std::string& device) const;
  std::vector<Device> devices_;
};

}  // namespace wan
