// Fuzz target: one GGUF file (formats/gguf.h) and the DiT store over it (ckpt/gguf_store.h). An input
// is written to a file and opened; what open() accepts must keep its promises: every tensor's bytes lie
// inside the data section, its byte count is its element count in whole blocks of its type, find()
// returns the listed tensor, and dequantising it (and serving it through the store, orig_shape KVs
// applied) reads only those bytes.
#include <cstddef>
#include <cstdint>

#include "ckpt/gguf_store.h"
#include "formats/gguf.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace wan;
  static const std::string path = (fuzz::scratch_dir() / "input.gguf").string();
  fuzz::write_file(path, data, size);
  constexpr uint64_t kSmall = uint64_t{1} << 20;  // dequantise only small tensors: one input stays fast
  const bool opened = fuzz::accepts([&] {
    auto f = GgufFile::open(path);
    fuzz::require(f->data_start() % f->alignment() == 0, "data section aligned");
    const uint64_t data_bytes = f->data_start() <= size ? size - f->data_start() : 0;
    for (const GgufTensorInfo& t : f->tensors()) {
      const GgmlTypeInfo& info = ggml_info(t.type);
      fuzz::require(t.offset <= data_bytes && t.nbytes <= data_bytes - t.offset, "tensor inside the data section");
      fuzz::require(t.numel % info.block_size == 0 && t.nbytes == t.numel / info.block_size * info.type_size,
                    "tensor bytes are whole blocks of its type");
      fuzz::require(f->find(t.name) == &t, "find() returns the listed tensor");
      fuzz::require(static_cast<uint64_t>(t.torch_shape().numel()) == t.numel, "torch shape holds the elements");
      if (info.dequantizable && t.numel <= kSmall) {
        Tensor y = f->dequantize(t.name);
        volatile float sink = 0;
        for (int64_t i = 0; i < y.numel(); ++i) sink = sink + y.f32()[i];
      }
    }
    for (const GgufKV& kv : f->metadata()) (void)kv.value.str_brief();
  });
  if (opened) {
    fuzz::accepts([&] {
      auto s = open_gguf_dit(path);
      for (const std::string& n : s->names()) {
        const Shape shape = s->shape(n);
        if (shape.numel() > static_cast<int64_t>(kSmall)) continue;
        fuzz::accepts([&] {
          Tensor y = s->get_f32(n);
          fuzz::require(y.shape() == shape, "get_f32() has the store's shape");
        });
        if (auto span = s->raw_span(n)) fuzz::require(span->offset + span->length <= size, "raw span inside the file");
      }
    });
  }
  return 0;
}
