//! The video VAE's architecture as an LTX-2 checkpoint's `config` metadata gives it (its `vae` section), read
//! with the defaults and the padding-mode rules of ltx-core's `VideoEncoderConfigurator` /
//! `VideoDecoderConfigurator`: the encoder and decoder block lists, the latent width, the patch size, the
//! decoder's causality and timestep conditioning.

use serde_json::Value;

/// The convolutions' spatial padding (`PaddingModeType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Padding {
    Zeros,
    Reflect,
    Replicate,
}

impl Padding {
    fn parse(name: &str) -> Result<Self, String> {
        match name {
            "zeros" => Ok(Self::Zeros),
            "reflect" => Ok(Self::Reflect),
            "replicate" => Ok(Self::Replicate),
            other => Err(format!(
                "spatial padding `{other}` is not supported (zeros, reflect, replicate)"
            )),
        }
    }
}

/// How the encoder's last convolution carries the log-variance (`LogVarianceType`): the means are the first
/// `latent_channels` channels in each case read here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogVariance {
    /// One shared channel after the means (`uniform`, `constant`).
    Shared,
    /// One per mean (`per_channel`).
    PerChannel,
}

/// One encoder block (`encoder_blocks` entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EncoderBlock {
    /// `res_x`: `num_layers` residual blocks of the same width.
    Res { layers: usize },
    /// `res_x_y`: one residual block multiplying the width by `multiplier`.
    ResWiden { multiplier: usize },
    /// `compress_{time,space,all}_res`: space-to-depth by `stride` (t, h, w) with a convolution, the width × `multiplier`.
    Downsample {
        stride: (usize, usize, usize),
        multiplier: usize,
    },
}

/// One decoder block (`decoder_blocks` entry, run in reverse).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecoderBlock {
    /// `res_x`: `num_layers` residual blocks, timestep-conditioned when the decoder is.
    Res { layers: usize, inject_noise: bool },
    /// `res_x_y`: one residual block dividing the width by `multiplier`.
    ResNarrow {
        multiplier: usize,
        inject_noise: bool,
    },
    /// `compress_{time,space,all}`: a convolution then depth-to-space by `stride`, the width ÷ `multiplier`.
    Upsample {
        stride: (usize, usize, usize),
        multiplier: usize,
        residual: bool,
    },
}

/// The video VAE's constructor arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct Ltx2VaeConfig {
    pub in_channels: usize,
    pub out_channels: usize,
    pub latent_channels: usize,
    pub patch_size: usize,
    pub log_variance: LogVariance,
    pub encoder_blocks: Vec<EncoderBlock>,
    pub decoder_blocks: Vec<DecoderBlock>,
    pub encoder_padding: Padding,
    pub decoder_padding: Padding,
    /// Whether the decoder pads time causally (`causal_decoder`; the encoder always does).
    pub causal_decoder: bool,
    /// Whether the decoder is timestep-conditioned (and then mixes noise into the latents first).
    pub timestep_conditioning: bool,
    pub decoder_base_channels: usize,
}

/// The stride of a `compress_*` block name.
fn stride_of(name: &str) -> Option<(usize, usize, usize)> {
    let base = name.strip_suffix("_res").unwrap_or(name);
    match base {
        "compress_time" => Some((2, 1, 1)),
        "compress_space" => Some((1, 2, 2)),
        "compress_all" => Some((2, 2, 2)),
        _ => None,
    }
}

/// `(name, params)` of a block entry; an integer parameter is `num_layers`.
fn entry(v: &Value) -> Result<(&str, serde_json::Map<String, Value>), String> {
    let pair = v.as_array().filter(|a| a.len() == 2);
    let (Some(name), Some(params)) = (pair.and_then(|a| a[0].as_str()), pair.map(|a| a[1].clone()))
    else {
        return Err(format!("a block entry is not [name, params]: {v}"));
    };
    let params = match params {
        Value::Object(m) => m,
        Value::Number(n) => {
            let mut m = serde_json::Map::new();
            m.insert("num_layers".into(), Value::Number(n));
            m
        }
        other => return Err(format!("block `{name}` has parameters {other}")),
    };
    Ok((name, params))
}

fn uint(
    params: &serde_json::Map<String, Value>,
    key: &str,
    default: Option<usize>,
) -> Result<usize, String> {
    match params.get(key) {
        Some(v) => v
            .as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| format!("`{key}` is not a count: {v}")),
        None => default.ok_or_else(|| format!("a block lacks `{key}`")),
    }
}

fn flag(params: &serde_json::Map<String, Value>, key: &str) -> bool {
    params.get(key).and_then(Value::as_bool).unwrap_or(false)
}

fn encoder_block(v: &Value) -> Result<EncoderBlock, String> {
    let (name, p) = entry(v)?;
    match name {
        "res_x" => Ok(EncoderBlock::Res {
            layers: uint(&p, "num_layers", None)?,
        }),
        "res_x_y" => Ok(EncoderBlock::ResWiden {
            multiplier: uint(&p, "multiplier", Some(2))?,
        }),
        n if n.ends_with("_res") && stride_of(n).is_some() => Ok(EncoderBlock::Downsample {
            stride: stride_of(n).unwrap_or((1, 1, 1)),
            multiplier: uint(&p, "multiplier", Some(2))?,
        }),
        other => Err(format!(
            "encoder block `{other}` is not supported (res_x, res_x_y, compress_time_res, compress_space_res, \
             compress_all_res)"
        )),
    }
}

fn decoder_block(v: &Value) -> Result<DecoderBlock, String> {
    let (name, p) = entry(v)?;
    let inject_noise = flag(&p, "inject_noise");
    match name {
        "res_x" => Ok(DecoderBlock::Res {
            layers: uint(&p, "num_layers", None)?,
            inject_noise,
        }),
        "res_x_y" => Ok(DecoderBlock::ResNarrow {
            multiplier: uint(&p, "multiplier", Some(2))?,
            inject_noise,
        }),
        n if !n.ends_with("_res") && stride_of(n).is_some() => {
            let stride = stride_of(n).unwrap_or((1, 1, 1));
            Ok(DecoderBlock::Upsample {
                stride,
                multiplier: uint(&p, "multiplier", Some(1))?,
                // Only `compress_all` reads `residual` officially.
                residual: stride == (2, 2, 2) && flag(&p, "residual"),
            })
        }
        other => Err(format!(
            "decoder block `{other}` is not supported (res_x, res_x_y, compress_time, compress_space, compress_all)"
        )),
    }
}

impl Ltx2VaeConfig {
    /// Reads the `vae` section of a checkpoint's config (ltx-core's defaults for absent keys).
    pub fn from_vae_json(vae: &Value) -> Result<Self, String> {
        let class = vae
            .get("_class_name")
            .and_then(Value::as_str)
            .unwrap_or("CausalVideoAutoencoder");
        if class != "CausalVideoAutoencoder" || vae.get("encoder").is_some() {
            return Err(format!(
                "the VAE is `{class}` (a diffusion decoder), not the convolutional CausalVideoAutoencoder of \
                 LTX-2 / LTX-2.3"
            ));
        }
        let num = |k: &str, d: usize| vae.get(k).and_then(Value::as_u64).map_or(d, |n| n as usize);
        let text = |k: &str| vae.get(k).and_then(Value::as_str);
        let boolean = |k: &str, d: bool| vae.get(k).and_then(Value::as_bool).unwrap_or(d);
        if num("dims", 3) != 3 {
            return Err("only 3-D VAEs (`dims` 3) are supported".into());
        }
        if text("norm_layer").unwrap_or("pixel_norm") != "pixel_norm" {
            return Err("only `norm_layer` pixel_norm is supported".into());
        }
        let log_variance = match text("latent_log_var").unwrap_or("uniform") {
            "uniform" | "constant" => LogVariance::Shared,
            "per_channel" => LogVariance::PerChannel,
            other => return Err(format!("`latent_log_var` {other} is not supported")),
        };
        let list = |k: &str| {
            vae.get(k)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        let encoder_padding = Padding::parse(
            text("spatial_padding_mode")
                .or(text("encoder_spatial_padding_mode"))
                .unwrap_or("zeros"),
        )?;
        let cfg = Self {
            in_channels: num("in_channels", 3),
            out_channels: num("out_channels", 3),
            latent_channels: num("latent_channels", 128),
            patch_size: num("patch_size", 4),
            log_variance,
            encoder_blocks: list("encoder_blocks")
                .iter()
                .map(encoder_block)
                .collect::<Result<_, _>>()?,
            decoder_blocks: list("decoder_blocks")
                .iter()
                .map(decoder_block)
                .collect::<Result<_, _>>()?,
            encoder_padding,
            decoder_padding: Padding::parse(text("spatial_padding_mode").unwrap_or("reflect"))?,
            causal_decoder: boolean("causal_decoder", false),
            timestep_conditioning: boolean("timestep_conditioning", true),
            decoder_base_channels: num("decoder_base_channels", 128),
        };
        if cfg.patch_size == 0 || cfg.latent_channels == 0 {
            return Err("`patch_size` and `latent_channels` must be positive".into());
        }
        Ok(cfg)
    }

    /// Reads the `vae` section from a checkpoint's `config` metadata text.
    pub fn from_metadata_config(text: &str) -> Result<Self, String> {
        let parsed: Value = serde_json::from_str(text)
            .map_err(|e| format!("the `config` metadata is not JSON: {e}"))?;
        let vae = parsed
            .get("vae")
            .ok_or("the `config` metadata has no `vae` section")?;
        Self::from_vae_json(vae)
    }

    /// Pixels per latent pixel and frames per latent frame after the first, from the encoder's blocks.
    pub fn encoder_factors(&self) -> (usize, usize) {
        let strides = self.encoder_blocks.iter().filter_map(|b| match b {
            EncoderBlock::Downsample { stride, .. } => Some(*stride),
            _ => None,
        });
        factors(strides, self.patch_size)
    }

    /// The same for the decoder's blocks.
    pub fn decoder_factors(&self) -> (usize, usize) {
        let strides = self.decoder_blocks.iter().filter_map(|b| match b {
            DecoderBlock::Upsample { stride, .. } => Some(*stride),
            _ => None,
        });
        factors(strides, self.patch_size)
    }

    /// The decoder's width after `conv_in`: the base width times every upsampler's and `res_x_y`'s multiplier.
    pub fn decoder_bottleneck(&self) -> usize {
        let product: usize = self
            .decoder_blocks
            .iter()
            .map(|b| match b {
                DecoderBlock::Upsample { multiplier, .. }
                | DecoderBlock::ResNarrow { multiplier, .. } => *multiplier,
                DecoderBlock::Res { .. } => 1,
            })
            .product();
        self.decoder_base_channels * product
    }
}

/// `(spatial, temporal)` factors of a list of strides after a patchify of `patch`.
fn factors(strides: impl Iterator<Item = (usize, usize, usize)>, patch: usize) -> (usize, usize) {
    strides.fold((patch, 1), |(s, t), (st, sh, _)| (s * sh, t * st))
}
