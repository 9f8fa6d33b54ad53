// Fuzz target: one safetensors file (formats/safetensors.h), header and data section as written
// by any tool. An input is written to a file and opened like a checkpoint shard; what open() accepts
// must keep its promises: every tensor's byte range lies inside the data section and matches its
// shape and dtype, and get() (plus the conversion a loader does) reads only those bytes.
#include <cstddef>
#include <cstdint>

#include "formats/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace wan;
  static const std::string path = (fuzz::scratch_dir() / "input.safetensors").string();
  fuzz::write_file(path, data, size);
  fuzz::accepts([&] {
    auto f = SafetensorsFile::open(path);
    const uint64_t data_bytes = size - f->data_start();
    fuzz::require(f->data_start() >= 8 && f->data_start() <= size, "data section inside the file");
    for (const TensorInfo& t : f->tensors()) {
      fuzz::require(t.begin <= t.end && t.end <= data_bytes, "tensor range inside the data section");
      fuzz::require(t.nbytes() == static_cast<size_t>(t.shape.numel()) * dtype_size(t.dtype),
                    "tensor bytes match shape x dtype");
      fuzz::require(f->find(t.name) == &t, "find() returns the listed tensor");
      Tensor x = f->get(t.name);
      fuzz::require(x.numel() == t.shape.numel() && x.dtype() == t.dtype, "get() matches the header");
      // A loader converts floats to f32; keep it to small tensors so one input stays fast.
      if (dtype_is_float(t.dtype) && t.nbytes() <= (1u << 20)) {
        Tensor y = x.to_f32();
        volatile float sink = 0;
        for (int64_t i = 0; i < y.numel(); ++i) sink = sink + y.f32()[i];
      }
    }
  });
  return 0;
}
