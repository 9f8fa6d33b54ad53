// Fuzz target: torch.save files (formats/pth.h) and the two parsers under them. An input that starts
// with "PK" is a zip archive: its central directory is read straight from the input buffer
// (formats/zip.h, so AddressSanitizer sees any read past the end), then the input is written to a
// file and opened as a .pth (zip + data.pkl + every tensor's extent). Any other input is a bare
// data.pkl for the restricted unpickler (formats/pickle.h), which a zip mutation rarely reaches
// because data.pkl carries a CRC. What open() accepts must serve every tensor it lists.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "formats/pickle.h"
#include "formats/pth.h"
#include "formats/zip.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace wan;
  if (size < 2 || std::memcmp(data, "PK", 2) != 0) {
    fuzz::accepts([&] {
      pickle::Unpickler up(data, size, "data.pkl");
      fuzz::require(up.load() != nullptr, "load() returns a value");
    });
    return 0;
  }
  fuzz::accepts([&] {
    for (const zip::Entry& e : zip::read_directory(data, size, "input.pth"))
      fuzz::require(e.method != 0 || (e.data_offset <= size && e.size <= size - e.data_offset),
                    "a stored entry lies inside the archive");
  });
  static const std::string path = (fuzz::scratch_dir() / "input.pth").string();
  fuzz::write_file(path, data, size);
  fuzz::accepts([&] {
    auto f = PthFile::open(path);
    for (const PthTensorInfo& t : f->tensors()) {
      fuzz::require(f->find(t.name) == &t, "find() returns the listed tensor");
      // A stride-0 view may legally stand for far more elements than the file holds; loaders check
      // shapes against the model's weight table first, so only moderate tensors are materialised.
      if (static_cast<uint64_t>(t.shape.numel()) * dtype_size(t.dtype) > (64u << 20)) continue;
      Tensor x = f->get(t.name);
      fuzz::require(x.numel() == t.shape.numel() && x.dtype() == t.dtype, "get() matches the listing");
    }
  });
  return 0;
}
