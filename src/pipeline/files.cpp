// Embeddings / latents files and output handling (see files.h for the formats).
#include "pipeline/files.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "core/error.h"
#include "st/safetensors.h"

namespace wan {
namespace {

namespace fs = std::filesystem;

// The one tensor `name` of a safetensors file, as f32 with the leading batch dim of 1 dropped when
// the rank is `rank` + 1; checks rank, non-empty dims and finiteness.
Tensor read_one(const std::string& path, const char* name, int rank, const char* layout) {
  WAN_CHECK(!path.empty(), "empty file name for the ", name, " file");
  std::error_code ec;
  WAN_CHECK(fs::exists(path, ec), path, ": no such file");
  WAN_CHECK(fs::is_regular_file(path, ec), path, ": not a file");
  std::shared_ptr<SafetensorsFile> f;
  WAN_WITH_CONTEXT(path, f = SafetensorsFile::open(path));
  if (!f->find(name)) {
    std::string have;
    for (const auto& t : f->tensors()) have += (have.empty() ? "" : ", ") + t.name;
    WAN_THROW(path, ": no tensor \"", name, "\" (has: ", have.empty() ? "nothing" : have, "); expected \"", name,
              "\" ", layout);
  }
  Tensor t = f->get(name);
  WAN_CHECK(dtype_is_float(t.dtype()), path, ": tensor \"", name, "\" has dtype ", dtype_name(t.dtype()),
            ", expected a float type");
  if (t.ndim() == rank + 1 && t.dim(0) == 1) {
    std::vector<int64_t> d = t.shape().vec();
    d.erase(d.begin());
    t = t.reshape(Shape(d));
  }
  WAN_CHECK(t.ndim() == rank, path, ": tensor \"", name, "\" has shape ", t.shape().str(), ", expected ", layout);
  for (int i = 0; i < rank; ++i)
    WAN_CHECK(t.dim(i) > 0, path, ": tensor \"", name, "\" is empty (shape ", t.shape().str(), ")");
  Tensor out = t.to(DType::F32);  // a copy: the mapping is released with f
  const float* p = out.f32();
  for (int64_t i = 0; i < out.numel(); ++i)
    WAN_CHECK(std::isfinite(p[i]), path, ": tensor \"", name, "\" has a non-finite value at element ", i);
  return out;
}

void write_one(const std::string& path, const char* name, const Tensor& t,
               const std::map<std::string, std::string>& metadata) {
  Tensor f = t.to_f32();
  WAN_WITH_CONTEXT(path, write_safetensors(path, {{name, f}}, metadata));
}

}  // namespace

Tensor read_prompt_embeds(const std::string& path) {
  Tensor e = read_one(path, kPromptEmbedsTensor, 2, "[L, text_dim] (L real tokens)");
  WAN_CHECK(e.dim(0) <= 512, path, ": \"", kPromptEmbedsTensor, "\" has ", e.dim(0),
            " tokens, more than the text length 512");
  return e;
}

void write_prompt_embeds(const std::string& path, const Tensor& embeds,
                         const std::map<std::string, std::string>& metadata) {
  WAN_ASSERT(embeds.ndim() == 2, embeds.shape().str());
  write_one(path, kPromptEmbedsTensor, embeds, metadata);
}

Tensor read_latents(const std::string& path) {
  return read_one(path, kLatentsTensor, 4, "[C, T_lat, H_lat, W_lat]");
}

void write_latents(const std::string& path, const Tensor& latents, const std::map<std::string, std::string>& metadata) {
  WAN_ASSERT(latents.ndim() == 4, latents.shape().str());
  write_one(path, kLatentsTensor, latents, metadata);
}

void write_text_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    WAN_CHECK(f.good(), tmp, ": cannot create");
    f << text;
    f.flush();
    if (!f.good()) {
      f.close();
      std::remove(tmp.c_str());
      WAN_THROW(tmp, ": write failed");
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    WAN_THROW(path, ": cannot rename the temporary file into place: ", ec.message());
  }
}

void check_output_path(const std::string& path, const std::string& what) {
  WAN_CHECK(!path.empty(), what, ": empty file name");
  std::error_code ec;
  fs::path p(path);
  WAN_CHECK(!fs::is_directory(p, ec), what, " ", path, ": is a folder, expected a file name");
  fs::path parent = p.parent_path();
  if (parent.empty()) parent = ".";
  WAN_CHECK(fs::is_directory(parent, ec), what, " ", path, ": folder ", parent.string(), " does not exist");
}

PendingOutputs::~PendingOutputs() { rollback(); }

void PendingOutputs::rollback() {
  for (const std::string& p : paths_) std::remove(p.c_str());
  paths_.clear();
}

}  // namespace wan
