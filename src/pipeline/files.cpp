// Embeddings / latents / state files and the checks on output paths (see files.h for the formats).
#include "pipeline/files.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "core/error.h"
#include "formats/output_file.h"
#include "formats/safetensors.h"
#include "formats/video.h"
#include "pipeline/pipeline.h"

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

namespace {

constexpr const char* kStateSampler[3] = {"sampler.m_last", "sampler.m_prev", "sampler.last_sample"};

Tensor f64_tensor(const std::vector<double>& v) {
  Tensor t = Tensor::empty(DType::F64, Shape{static_cast<int64_t>(v.size())});
  if (!v.empty()) std::memcpy(t.data(), v.data(), v.size() * 8);
  return t;
}

Tensor i64_tensor(const std::vector<int64_t>& v) {
  Tensor t = Tensor::empty(DType::I64, Shape{static_cast<int64_t>(v.size())});
  std::memcpy(t.data(), v.data(), v.size() * 8);
  return t;
}

Tensor f32_vector(const std::vector<float>& v) {
  Tensor t = Tensor::empty(DType::F32, Shape{static_cast<int64_t>(v.size())});
  std::memcpy(t.data(), v.data(), v.size() * 4);
  return t;
}

}  // namespace

void write_run_state(const std::string& path, const RunState& st, const std::map<std::string, std::string>& metadata) {
  WAN_ASSERT(st.latents.ndim() == 4 && st.prompt_embeds.ndim() == 2 && st.negative_embeds.ndim() == 2, "run state");
  std::vector<std::pair<std::string, Tensor>> t;
  // Largest element size first keeps every tensor aligned (formats/safetensors.h).
  t.push_back({"timings.stage_s", f64_tensor({st.timings.load_text_encoder, st.timings.text_encode,
                                               st.timings.load_dit, st.timings.denoise})});
  t.push_back({"timings.step_s", f64_tensor(st.timings.step_seconds)});
  t.push_back({"timings.peak_bytes", i64_tensor({st.peak_device_bytes, st.peak_rss_bytes})});
  t.push_back({"state.step", i64_tensor({st.step})});
  t.push_back({kLatentsTensor, st.latents.to_f32()});
  const std::vector<float>* hist[3] = {&st.sampler.m_last, &st.sampler.m_prev, &st.sampler.last_sample};
  for (int k = 0; k < 3; ++k)
    if (!hist[k]->empty()) t.push_back({kStateSampler[k], f32_vector(*hist[k])});
  t.push_back({kPromptEmbedsTensor, st.prompt_embeds.to_f32()});
  t.push_back({"negative_prompt_embeds", st.negative_embeds.to_f32()});
  Tensor fp = Tensor::empty(DType::U8, Shape{static_cast<int64_t>(st.fingerprint.size())});
  std::memcpy(fp.data(), st.fingerprint.data(), st.fingerprint.size());
  t.push_back({"state.fingerprint", fp});
  WAN_WITH_CONTEXT(path, write_safetensors(path, t, metadata));
}

RunState read_run_state(const std::string& path) {
  WAN_CHECK(!path.empty(), "--resume: empty file name");
  std::error_code ec;
  WAN_CHECK(fs::exists(path, ec), path, ": no such file");
  WAN_CHECK(fs::is_regular_file(path, ec), path, ": not a file");
  std::shared_ptr<SafetensorsFile> f = SafetensorsFile::open(path);  // its errors name the file
  auto get = [&](const char* name, DType dtype, int rank) {
    WAN_CHECK(f->find(name), path, ": no tensor \"", name, "\" (not a state file written by wan generate --save-state)");
    Tensor x = f->get(name);
    WAN_CHECK(x.dtype() == dtype && x.ndim() == rank, path, ": tensor \"", name, "\" is ", dtype_name(x.dtype()), " ",
              x.shape().str(), ", expected ", dtype_name(dtype), " of rank ", rank);
    return x.clone();
  };
  auto finite = [&](const Tensor& x, const char* name) {
    const float* p = x.f32();
    for (int64_t i = 0; i < x.numel(); ++i)
      WAN_CHECK(std::isfinite(p[i]), path, ": tensor \"", name, "\" has a non-finite value at element ", i);
  };
  RunState st;
  const Tensor step = get("state.step", DType::I64, 1);
  WAN_CHECK(step.numel() == 1, path, ": \"state.step\" must hold one value");
  const int64_t step_v = static_cast<const int64_t*>(step.data())[0];
  WAN_CHECK(step_v >= 1 && step_v <= 10000, path, ": step ", step_v, " is outside 1..10000");
  st.step = static_cast<int>(step_v);
  const Tensor fp = get("state.fingerprint", DType::U8, 1);
  st.fingerprint.assign(static_cast<const char*>(fp.data()), static_cast<size_t>(fp.numel()));
  // plan_fingerprint() writes a flat object of strings. Checked before anything prints a value: dump()
  // recurses once per nesting level, and a fingerprint nested 100000 deep would overflow the stack.
  const auto fj = nlohmann::json::parse(st.fingerprint, nullptr, /*allow_exceptions=*/false);
  bool flat = fj.is_object();
  for (auto it = fj.begin(); flat && it != fj.end(); ++it) flat = it->is_string();
  WAN_CHECK(flat, path, ": invalid fingerprint (expected a JSON object of strings)");
  WAN_CHECK(fingerprint_differences(st.fingerprint, st.fingerprint).empty(), path, ": invalid fingerprint");
  st.latents = get(kLatentsTensor, DType::F32, 4);
  finite(st.latents, kLatentsTensor);
  for (int i = 0; i < 4; ++i) WAN_CHECK(st.latents.dim(i) > 0, path, ": empty latents");
  const size_t n = static_cast<size_t>(st.latents.numel());
  std::vector<float>* hist[3] = {&st.sampler.m_last, &st.sampler.m_prev, &st.sampler.last_sample};
  for (int k = 0; k < 3; ++k) {
    if (!f->find(kStateSampler[k])) continue;
    const Tensor h = get(kStateSampler[k], DType::F32, 1);
    WAN_CHECK(static_cast<size_t>(h.numel()) == n, path, ": \"", kStateSampler[k], "\" has ", h.numel(),
              " values, the latents ", n);
    finite(h, kStateSampler[k]);
    hist[k]->assign(h.f32(), h.f32() + n);
  }
  st.sampler.index = st.step;
  st.sampler.n = n;  // the history (if any) was checked to hold n values
  for (const char* name : {kPromptEmbedsTensor, "negative_prompt_embeds"}) {
    const Tensor e = get(name, DType::F32, 2);
    WAN_CHECK(e.dim(0) >= 1 && e.dim(0) <= 512 && e.dim(1) >= 1, path, ": \"", name, "\" has shape ", e.shape().str());
    finite(e, name);
    (name == std::string(kPromptEmbedsTensor) ? st.prompt_embeds : st.negative_embeds) = e;
  }
  WAN_CHECK(st.prompt_embeds.dim(1) == st.negative_embeds.dim(1), path, ": the two text embeddings differ in width");
  const Tensor stage = get("timings.stage_s", DType::F64, 1), steps = get("timings.step_s", DType::F64, 1);
  const Tensor peaks = get("timings.peak_bytes", DType::I64, 1);
  WAN_CHECK(stage.numel() == 4 && steps.numel() == st.step && peaks.numel() == 2, path,
            ": timings tensors of the wrong sizes");
  const double* sv = static_cast<const double*>(stage.data());
  st.timings.load_text_encoder = sv[0];
  st.timings.text_encode = sv[1];
  st.timings.load_dit = sv[2];
  st.timings.denoise = sv[3];
  const double* pv = static_cast<const double*>(steps.data());
  st.timings.step_seconds.assign(pv, pv + steps.numel());
  st.peak_device_bytes = static_cast<const int64_t*>(peaks.data())[0];
  st.peak_rss_bytes = static_cast<const int64_t*>(peaks.data())[1];
  return st;
}

void write_text_file(const std::string& path, const std::string& text) {
  OutputFile out(path, path);
  out.write(text.data(), text.size());
  out.commit();
}

void check_output_path(const std::string& path, const std::string& what) {
  WAN_CHECK(!path.empty(), what, ": empty file name");
  check_output_writable(path, cat(what, " ", path));
}

VideoFormat check_video_output(const std::string& path, const std::string& what, bool overwrite_frames) {
  WAN_CHECK(!path.empty(), what, ": empty file name");
  (void)resolve_output_target(path, cat(what, " ", path));  // "is a folder" before "unknown extension"
  const VideoFormat format = video_format_from_path(path);
  WAN_CHECK(format != VideoFormat::Mp4 || video_have_ffmpeg(), what, " ", path,
            ": this build has no FFmpeg for .mp4; use .y4m or .png");
  check_output_path(path, what);
  if (format == VideoFormat::Png && !overwrite_frames) {
    const std::vector<std::string> old = existing_png_frames(path);
    WAN_CHECK(old.empty(), what, " ", path, ": the folder already holds ", old.size(), " frame(s) of this sequence (",
              old.empty() ? "" : fs::path(old[0]).filename().string(), old.size() > 1 ? ", ..." : "",
              "); pass --overwrite-frames to replace them (frames the new sequence does not reach are removed)");
  }
  return format;
}

std::vector<NamedFile> checkpoint_input_files(const CheckpointInfo& info) {
  std::vector<NamedFile> out;
  for (const Component& c : info.components) {
    const std::string what = cat("a file of the checkpoint's ", role_name(c.role));
    std::error_code ec;
    if (!fs::is_directory(c.path, ec)) {
      out.push_back({what, c.path});
      continue;
    }
    for (fs::recursive_directory_iterator it(c.path, ec), end; !ec && it != end; it.increment(ec))
      if (it->is_regular_file(ec)) out.push_back({what, it->path().string()});
  }
  return out;
}

void check_outputs_distinct(const std::vector<NamedFile>& outputs, const std::vector<NamedFile>& inputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const NamedFile& o = outputs[i];
    if (o.path.empty()) continue;
    for (const NamedFile& in : inputs)
      WAN_CHECK(in.path.empty() || !same_file(o.path, in.path), o.what, " ", o.path, ": is an input of this run (",
                in.what, " ", in.path, "); refusing to overwrite it");
    for (size_t k = 0; k < i; ++k)
      WAN_CHECK(outputs[k].path.empty() || !same_file(o.path, outputs[k].path), o.what, " ", o.path,
                ": the same file as ", outputs[k].what, " ", outputs[k].path);
  }
}

std::vector<NamedFile> video_output_files(const NamedFile& output, int frames) {
  std::string ext = fs::path(output.path).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (frames <= 1 || ext != ".png") return {output};
  std::vector<NamedFile> out;
  for (const std::string& p : png_sequence_paths(output.path, frames)) out.push_back({output.what, p});
  return out;
}

void check_generate_outputs(const GenerateOptions& o, const GeneratePlan& p) {
  std::vector<NamedFile> outs;
  for (const NamedFile& f : o.outputs)
    for (const NamedFile& g : f.what == "--output" ? video_output_files(f, p.frames) : std::vector<NamedFile>{f})
      outs.push_back(g);
  std::vector<NamedFile> ins = checkpoint_input_files(p.ckpt);
  ins.push_back({"--prompt-embeds", o.prompt_embeds_file});
  ins.push_back({"--negative-prompt-embeds", o.negative_embeds_file});
  ins.push_back({"--init-latents", o.init_latents_file});
  ins.push_back({"--image", o.image_file});
  ins.push_back({"--last-image", o.last_image_file});
  ins.push_back({"--resume", o.resume_file});
  check_outputs_distinct(outs, ins);
}

}  // namespace wan
