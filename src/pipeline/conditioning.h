// Image conditioning of I2V-A14B and TI2V-5B (spec §1.4, §7.5.2, §7.5.3): the video size an image
// implies, the image sized exactly as the official code sizes it, and the DiT's condition built from
// the VAE's encoding of it.
//   I2V:  bicubic resize of the [-1, 1] image (no crop) to the size derived from the max area and the
//         image's aspect (image2video.py); y = [mask (4), VAE2.1(image, zeros... [, last image])] (20).
//   TI2V: LANCZOS resize to cover the best 32-multiple size of the max area, centre crop
//         (textimage2video.py best_output_size); z = VAE2.2(image) holds latent frame 0.
// Invariants: sizing is plain arithmetic done while planning (before any model loads); the condition
// is the same for the conditional and the unconditional pass.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "core/tensor.h"
#include "formats/image.h"
#include "models/config.h"
#include "pipeline/denoiser.h"

namespace wan {

struct GenerateOptions;
struct GeneratePlan;

// The decoded --image / --last-image of a plan, between reading them and sizing them.
struct SourceImages {
  RgbImage first, last;  // width 0: not given
};
// Reads the images and checks they suit the task (before any model loads); when the video size is not
// given (--size, or --init-latents' shape), I2V derives it from the image (max area: the default size's),
// and TI2V's image mode always does (max area: --size or the default 1280x704), as the official code.
SourceImages plan_images(const GenerateOptions& o, GeneratePlan& p);
// p.image / p.last_image: the images at p's video size, sized as the task does (i2v_image / ti2v_image).
void size_images(const SourceImages& s, GeneratePlan& p);

// (width, height) of an I2V video from an image of iw x ih and `max_area` pixels (official: lat_h =
// ⌊⌊√(area·ih/iw)/8⌋/2⌋·2, lat_w = ⌊⌊√(area·iw/ih)/8⌋/2⌋·2, pixels 8·lat). Throws wan::Error when the
// aspect ratio leaves no latent rows or columns.
std::pair<int, int> i2v_video_size(int iw, int ih, int64_t max_area);
// (width, height) of a TI2V image-mode video: official best_output_size(iw, ih, 32, 32, max_area).
std::pair<int, int> ti2v_video_size(int iw, int ih, int64_t max_area);

// The image as the task feeds it to the VAE, [3, H, W] float32 in [-1, 1] at the video's W x H:
// I2V: (x/255 - 0.5)/0.5, then bicubic (align_corners false, no antialias, no clamp);
// TI2V: LANCZOS resize by max(W/iw, H/ih) to round(iw·s) x round(ih·s), centre crop, then (x - 0.5)/0.5.
Tensor i2v_image(const RgbImage& img, int W, int H);
Tensor ti2v_image(const RgbImage& img, int W, int H);

// I2V's pixel video [3, F, H, W]: the first image at frame 0, the last (if defined) at frame F - 1,
// zeros elsewhere.
Tensor i2v_pixel_video(const Tensor& first, const Tensor& last, int frames);
// I2V's mask [4, T_lat, h, w] (diffusers WanImageToVideoPipeline): the per-pixel-frame mask (1 for the
// image frames) with frame 0 repeated 4 times, folded into groups of 4 frames as channels.
Tensor i2v_mask(int frames, int64_t h, int64_t w, bool last);

// Encodes the plan's condition: `encode` maps a pixel video [3, F, H, W] to normalised latents (the
// CPU reference or the GPU encoder). I2V: y = [mask, encode(pixel video)]; TI2V: first_frame = encode
// of the image alone. `first` / `last` are the i2v_image / ti2v_image tensors (last: I2V only).
LatentCondition build_condition(Task task, const Tensor& first, const Tensor& last, int frames,
                                const std::function<Tensor(const Tensor&)>& encode);

}  // namespace wan
