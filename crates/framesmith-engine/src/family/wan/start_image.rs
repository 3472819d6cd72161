//! The start image of an image-to-video clip, prepared as the official pipelines prepare it: read and checked,
//! fitted to the clip's size, and turned into the DiT's conditioning — for Wan2.1 I2V / Wan2.2 I2V-A14B the
//! VAE latent of [image, black frames] with the mask channels (plus CLIP features for Wan2.1), for Wan2.2
//! TI2V-5B the latent of the image alone.

use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use image::imageops::{self, FilterType};
use image::RgbImage;

use crate::family::wan::denoise::ImageConditioning;
use crate::family::wan::pipeline::{latent_shape, ClipSettings, VaeDecoder};
use framesmith_models::wan::clip::preprocess::resize_bicubic_tensor;
use framesmith_models::wan::clip::ClipVision;
use framesmith_models::wan::{ModelType, WanConfig};

/// Why a start image cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StartImageError {
    #[error("start image not found: {}", path.display())]
    NotFound { path: PathBuf },
    #[error("cannot read the start image ({reason}); give a PNG, JPEG, WebP or BMP file: {}", path.display())]
    Unreadable { path: PathBuf, reason: String },
    #[error(
        "this is a text-to-video model ({model}): it takes no start image; drop --image, or give an I2V or \
         TI2V-5B model"
    )]
    NotImageModel { model: String },
    #[error("this image-to-video model ({model}) needs a start image: add --image PATH")]
    ImageMissing { model: String },
    #[error("Wan2.1 I2V needs the CLIP image encoder: add --clip models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth (or ComfyUI's clip_vision_h.safetensors)")]
    ClipMissing,
}

/// Checks that a start image is given exactly when the model `cfg` (named `model`) takes one. TI2V-5B takes
/// one optionally (without it, it generates from text alone).
pub fn check_image_use(
    cfg: &WanConfig,
    model: &str,
    has_image: bool,
) -> Result<(), StartImageError> {
    let model = model.to_string();
    match (cfg.model_type, has_image) {
        (ModelType::T2v, true) => Err(StartImageError::NotImageModel { model }),
        (ModelType::I2v, false) => Err(StartImageError::ImageMissing { model }),
        _ => Ok(()),
    }
}

/// Pixel budget of an image-to-video clip whose size is not given: 480p for Wan2.1 / Wan2.2 I2V (as
/// `--size 832*480`), and TI2V-5B's own 720p (`1280*704`).
pub fn default_max_area(cfg: &WanConfig) -> usize {
    match cfg.model_type {
        ModelType::Ti2v => 1280 * 704,
        _ => 832 * 480,
    }
}

/// The clip size `(width, height)` the official pipelines pick for a start image of `image_size` within
/// `max_area` pixels: Wan2.1 / Wan2.2 I2V keep the aspect ratio with sides rounded down to multiples of
/// VAE stride × patch (`WanI2V.generate`); TI2V-5B tries rounding the width first and the height first and keeps
/// the closer aspect ratio (`best_output_size`).
pub fn official_size(cfg: &WanConfig, image_size: (u32, u32), max_area: usize) -> (usize, usize) {
    let (iw, ih) = (
        f64::from(image_size.0.max(1)),
        f64::from(image_size.1.max(1)),
    );
    let area = max_area as f64;
    let patch = cfg.patch_size[1].max(cfg.patch_size[2]).max(1);
    if cfg.model_type != ModelType::Ti2v {
        let stride = 8.0;
        let p = patch as f64;
        let aspect = ih / iw;
        let lat_h = ((area * aspect).sqrt() / stride).floor() / p;
        let lat_w = ((area / aspect).sqrt() / stride).floor() / p;
        let side = |lat: f64| ((lat.floor() * p) as usize).max(patch) * 8;
        return (side(lat_w), side(lat_h));
    }
    let d = (16 * patch) as f64;
    let ratio = iw / ih;
    let ow = (area * ratio).sqrt();
    let oh = area / ow;
    let fit = |x: f64| ((x / d).floor() * d).max(d);
    let first = {
        let w = fit(ow);
        (w, fit(area / w))
    };
    let second = {
        let h = fit(oh);
        (fit(area / h), h)
    };
    let off = |(w, h): (f64, f64)| (ratio / (w / h)).max((w / h) / ratio);
    let (w, h) = if off(first) < off(second) {
        first
    } else {
        second
    };
    (w as usize, h as usize)
}

/// Reads the start image at `path` as RGB.
pub fn load_start_image(path: &Path) -> Result<RgbImage, StartImageError> {
    if !path.is_file() {
        return Err(StartImageError::NotFound {
            path: path.to_path_buf(),
        });
    }
    let unreadable = |reason: String| StartImageError::Unreadable {
        path: path.to_path_buf(),
        reason,
    };
    let reader = image::ImageReader::open(path)
        .and_then(|r| r.with_guessed_format())
        .map_err(|e| unreadable(e.to_string()))?;
    let image = reader.decode().map_err(|e| unreadable(e.to_string()))?;
    if image.width() == 0 || image.height() == 0 {
        return Err(unreadable("the image is empty".into()));
    }
    Ok(image.to_rgb8())
}

/// An RGB image as `[3, H, W]` f32 in [−1, 1] (`to_tensor(img).sub_(0.5).div_(0.5)`).
pub fn image_tensor(image: &RgbImage, device: &Device) -> candle_core::Result<Tensor> {
    let (w, h) = (image.width() as usize, image.height() as usize);
    // Built on the host: byte tensors and their casts are plain there on every backend.
    Tensor::from_vec(image.as_raw().clone(), (h, w, 3), &Device::Cpu)?
        .permute((2, 0, 1))?
        .to_dtype(DType::F32)?
        .affine(2.0 / 255.0, -1.0)?
        .to_device(device)
}

/// The centred crop of `image` with the aspect ratio of `width × height` (the whole image when it already has
/// it). The official Wan2.1 I2V sizes the clip from the image's aspect instead; with a fixed clip size, cropping
/// keeps the picture undistorted.
pub fn crop_to_aspect(image: &RgbImage, width: usize, height: usize) -> RgbImage {
    let (iw, ih) = (image.width() as u64, image.height() as u64);
    let (w, h) = (width.max(1) as u64, height.max(1) as u64);
    let (cw, ch) = if iw * h > ih * w {
        (((ih * w + h / 2) / h).clamp(1, iw), ih)
    } else {
        (iw, ((iw * h + w / 2) / w).clamp(1, ih))
    };
    if (cw, ch) == (iw, ih) {
        return image.clone();
    }
    imageops::crop_imm(
        image,
        ((iw - cw) / 2) as u32,
        ((ih - ch) / 2) as u32,
        cw as u32,
        ch as u32,
    )
    .to_image()
}

/// Wan2.2 TI2V's fit (`WanTI2V.i2v`): one Lanczos scale so the image covers `width × height` (sides rounded),
/// then the centre crop. PIL's and the `image` crate's Lanczos differ by rounding only.
pub fn fit_cover_lanczos(image: &RgbImage, width: usize, height: usize) -> RgbImage {
    let (iw, ih) = (f64::from(image.width()), f64::from(image.height()));
    let scale = (width as f64 / iw).max(height as f64 / ih);
    let sw = ((iw * scale).round() as u32).max(width as u32);
    let sh = ((ih * scale).round() as u32).max(height as u32);
    let scaled = if (sw, sh) == image.dimensions() {
        image.clone()
    } else {
        imageops::resize(image, sw, sh, FilterType::Lanczos3)
    };
    let (x, y) = ((sw - width as u32) / 2, (sh - height as u32) / 2);
    imageops::crop_imm(&scaled, x, y, width as u32, height as u32).to_image()
}

/// The normalised latent [z, f, h, w] (f32) of a video [3, T, H, W] in [−1, 1], tiled when the decoder is.
fn encode_video(vae: &VaeDecoder, video: &Tensor) -> candle_core::Result<Tensor> {
    let video = video.unsqueeze(0)?.to_dtype(vae.dtype)?;
    let z = match &vae.tiles {
        Some(tiles) => vae.vae.encode_tiled(&video, &vae.stats, tiles)?,
        None => vae.vae.encode(&video, &vae.stats)?,
    };
    z.squeeze(0)?.to_dtype(DType::F32)
}

/// The DiT conditioning of `image` for a clip of `settings` with the DiT `cfg`: see [`ImageConditioning`].
/// `clip` is required for Wan2.1 I2V (the DiT has `img_emb`).
pub fn image_conditioning(
    cfg: &WanConfig,
    image: &RgbImage,
    vae: &VaeDecoder,
    clip: Option<&ClipVision>,
    settings: &ClipSettings,
) -> anyhow::Result<ImageConditioning> {
    // Settings that do not fit the model fail here, before anything is encoded.
    latent_shape(cfg, vae.vae.config(), settings)?;
    let device = vae.stats.mean.device().clone();
    let (w, h) = (settings.width, settings.height);
    match cfg.model_type {
        ModelType::T2v => Err(StartImageError::NotImageModel {
            model: "T2V".into(),
        }
        .into()),
        ModelType::Ti2v => {
            let fitted = image_tensor(&fit_cover_lanczos(image, w, h), &device)?;
            let latent = encode_video(vae, &fitted.unsqueeze(1)?)?;
            Ok(ImageConditioning::FirstFrame { latent })
        }
        ModelType::I2v => {
            let y = image_channels(cfg, image, vae, settings)?;
            let clip = match (cfg.has_clip(), clip) {
                (true, Some(clip)) => Some(clip_features(clip, image, (w, h), &device)?),
                (true, None) => return Err(StartImageError::ClipMissing.into()),
                (false, _) => None,
            };
            Ok(ImageConditioning::Channels { y, clip })
        }
    }
}

/// The Wan2.1 I2V / Wan2.2 I2V-A14B conditioning channels `y` [4 + z, F, h, w] of `image` for a clip of
/// `settings` (`WanI2V.generate`): the mask (1 on the first latent frame's 4 channels), then the latent of the
/// image — cropped to the clip's aspect and resized (bicubic) to its size — followed by black frames.
pub fn image_channels(
    cfg: &WanConfig,
    image: &RgbImage,
    vae: &VaeDecoder,
    settings: &ClipSettings,
) -> anyhow::Result<Tensor> {
    let [_, f, lh, lw] = latent_shape(cfg, vae.vae.config(), settings)?;
    let device = vae.stats.mean.device().clone();
    let (w, h) = (settings.width, settings.height);
    let z = vae.vae.config().z_dim;
    if cfg.in_dim != cfg.out_dim + 4 + z {
        anyhow::bail!(
            "this I2V DiT takes {} input channels, but {} latent + 4 mask + {z} image channels come from \
             this VAE: use the VAE made for this model",
            cfg.in_dim,
            cfg.out_dim
        );
    }
    let source = image_tensor(&crop_to_aspect(image, w, h), &device)?;
    // The official order: the image resized (bicubic) to the clip size, then black frames.
    let first = resize_bicubic_tensor(&source, h, w)?.unsqueeze(1)?;
    let black = Tensor::zeros((3, settings.frames - 1, h, w), DType::F32, &device)?;
    let latent = encode_video(vae, &Tensor::cat(&[first, black], 1)?)?;
    let mask = Tensor::cat(
        &[
            Tensor::ones((4, 1, lh, lw), DType::F32, &device)?,
            Tensor::zeros((4, f - 1, lh, lw), DType::F32, &device)?,
        ],
        1,
    )?;
    Ok(Tensor::cat(&[mask, latent], 0)?)
}

/// The CLIP features [1, tokens, dim] of a start image for a clip of `(width, height)`, as Wan2.1 I2V encodes
/// it: the image cropped to the clip's aspect, in [−1, 1].
pub fn clip_features(
    clip: &ClipVision,
    image: &RgbImage,
    (width, height): (usize, usize),
    device: &Device,
) -> anyhow::Result<Tensor> {
    let source = image_tensor(&crop_to_aspect(image, width, height), device)?;
    clip.encode_image(&source)
        .context("encoding the start image with CLIP")
}

#[cfg(test)]
pub(crate) mod tests;
