// Fuzz target: the index of a sharded safetensors checkpoint (*.safetensors.index.json,
// formats/safetensors.h SafetensorsSet). The input is the index text; the folder it sits in holds two
// valid shards written once at start-up (model-00001-of-00002: "a", "b.weight"; model-00002-of-00002:
// "c", "d"), so inputs that name them reach the cross-checks between the map and the shards. What
// open() accepts must serve every listed name from the shard that holds it.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "formats/safetensors.h"
#include "fuzz_util.h"

namespace {

std::string make_folder() {
  using namespace wan;
  const auto dir = fuzz::scratch_dir() / "sharded";
  std::filesystem::create_directories(dir);
  auto tensor = [](DType t, Shape s) {
    Tensor x = Tensor::empty(t, s);
    if (x.numel()) std::memset(x.data(), 0x3c, static_cast<size_t>(x.numel()) * dtype_size(t));
    return x;
  };
  write_safetensors((dir / "model-00001-of-00002.safetensors").string(),
                    {{"a", tensor(DType::F32, Shape{2})}, {"b.weight", tensor(DType::BF16, Shape{2, 2})}});
  write_safetensors((dir / "model-00002-of-00002.safetensors").string(),
                    {{"c", tensor(DType::F16, Shape{3})}, {"d", tensor(DType::I64, Shape{})}});
  return (dir / "model.safetensors.index.json").string();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace wan;
  static const std::string index = make_folder();
  fuzz::write_file(index, data, size);
  fuzz::accepts([&] {
    SafetensorsSet set = SafetensorsSet::open(index);
    for (const std::string& n : set.names()) {
      fuzz::require(set.contains(n), "a listed name is contained");
      const TensorInfo& t = set.info(n);
      fuzz::require(t.name == n, "info() names the tensor asked for");
      Tensor x = set.get(n);
      fuzz::require(x.numel() == t.shape.numel(), "get() matches info()");
    }
  });
  return 0;
}
