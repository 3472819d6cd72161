//! The audio VAE's and the vocoder's architecture as an LTX-2 checkpoint's `config` metadata gives them (its
//! `audio_vae` and `vocoder` sections), read with the defaults and checks of ltx-core's
//! `AudioEncoderConfigurator`, `AudioDecoderConfigurator` and `VocoderConfigurator`: LTX-2's flat vocoder
//! section, LTX-2.3's nested `vocoder` + `bwe` one (a vocoder with bandwidth extension).

use serde_json::Value;

/// The axis along which the convolutions are causal (`CausalityAxis`; `height` is the spectrogram's time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Causality {
    None,
    Width,
    Height,
    WidthCompatibility,
}

impl Causality {
    fn parse(value: Option<&Value>) -> Result<Self, String> {
        match value {
            None => Ok(Self::Height),
            Some(Value::Null) => Ok(Self::None),
            Some(v) => match v.as_str() {
                Some("width") => Ok(Self::Width),
                Some("height") => Ok(Self::Height),
                Some("width-compatibility") => Ok(Self::WidthCompatibility),
                _ => Err(format!(
                    "causality_axis {v} is not one of null, width, height, width-compatibility"
                )),
            },
        }
    }
}

/// The audio VAE (`audio_vae` section: `model.params.ddconfig`, `model.params.sampling_rate`,
/// `preprocessing.stft`, `preprocessing.mel`).
#[derive(Debug, Clone, PartialEq)]
pub struct AudioVaeConfig {
    /// Base width (`ch`), also the number of per-channel statistics (latent channels × latent mel bins).
    pub ch: usize,
    pub out_ch: usize,
    pub ch_mult: Vec<usize>,
    pub num_res_blocks: usize,
    /// Resolutions (the `resolution` halved per level) whose blocks are followed by attention.
    pub attn_resolutions: Vec<usize>,
    pub resolution: usize,
    /// Latent channels.
    pub z_channels: usize,
    /// The encoder's last convolution gives means and log-variances (`double_z`).
    pub double_z: bool,
    /// Input channels of the spectrogram (2: stereo).
    pub in_channels: usize,
    pub causality: Causality,
    pub mid_block_add_attention: bool,
    pub sample_rate: usize,
    pub hop_length: usize,
    pub n_fft: usize,
    pub mel_bins: usize,
}

/// The spectrogram frames per latent frame (`LATENT_DOWNSAMPLE_FACTOR`).
pub const LATENT_DOWNSAMPLE_FACTOR: usize = 4;

fn usize_of(v: &Value, key: &str, default: usize) -> Result<usize, String> {
    match v.get(key) {
        None => Ok(default),
        Some(x) => x
            .as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| format!("`{key}` is {x}, expected a whole number")),
    }
}

fn bool_of(v: &Value, key: &str, default: bool) -> Result<bool, String> {
    match v.get(key) {
        None => Ok(default),
        Some(x) => x
            .as_bool()
            .ok_or_else(|| format!("`{key}` is {x}, expected true or false")),
    }
}

fn list_of(v: &Value, key: &str, default: &[usize]) -> Result<Vec<usize>, String> {
    match v.get(key) {
        None => Ok(default.to_vec()),
        Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|x| {
                x.as_u64()
                    .map(|n| n as usize)
                    .ok_or_else(|| format!("`{key}` holds {x}, expected whole numbers"))
            })
            .collect(),
        Some(x) => Err(format!("`{key}` is {x}, expected a list")),
    }
}

fn str_of<'a>(v: &'a Value, key: &str, default: &'a str) -> Result<&'a str, String> {
    match v.get(key) {
        None => Ok(default),
        Some(x) => x
            .as_str()
            .ok_or_else(|| format!("`{key}` is {x}, expected a string")),
    }
}

impl AudioVaeConfig {
    /// From the `audio_vae` section of a checkpoint's `config` metadata.
    pub fn from_json(section: &Value) -> Result<Self, String> {
        let null = Value::Null;
        let params = section
            .get("model")
            .and_then(|m| m.get("params"))
            .unwrap_or(&null);
        let dd = params.get("ddconfig").unwrap_or(&null);
        let pre = section.get("preprocessing").unwrap_or(&null);
        let stft = pre.get("stft").unwrap_or(&null);
        let mel = pre.get("mel").unwrap_or(&null);
        let variables = section.get("variables").unwrap_or(&null);
        let norm = str_of(dd, "norm_type", "pixel")?;
        if norm != "pixel" {
            return Err(format!(
                "norm_type `{norm}` is not supported (the releases use `pixel`; ltx-core refuses group norm with a \
                 causal axis)"
            ));
        }
        let attn = str_of(dd, "attn_type", "vanilla")?;
        if attn != "vanilla" {
            return Err(format!("attn_type `{attn}` is not supported (vanilla)"));
        }
        let mel_bins = [
            dd.get("mel_bins"),
            mel.get("n_mel_channels"),
            variables.get("mel_bins"),
        ]
        .into_iter()
        .flatten()
        .find_map(Value::as_u64)
        .ok_or("the audio VAE's mel bins are not given (ddconfig.mel_bins)")?
            as usize;
        let cfg = Self {
            ch: usize_of(dd, "ch", 128)?,
            out_ch: usize_of(dd, "out_ch", 2)?,
            ch_mult: list_of(dd, "ch_mult", &[1, 2, 4])?,
            num_res_blocks: usize_of(dd, "num_res_blocks", 2)?,
            attn_resolutions: list_of(dd, "attn_resolutions", &[8, 16, 32])?,
            resolution: usize_of(dd, "resolution", 256)?,
            z_channels: usize_of(dd, "z_channels", 8)?,
            double_z: bool_of(dd, "double_z", true)?,
            in_channels: usize_of(dd, "in_channels", 2)?,
            causality: Causality::parse(dd.get("causality_axis"))?,
            mid_block_add_attention: bool_of(dd, "mid_block_add_attention", true)?,
            sample_rate: usize_of(params, "sampling_rate", 16000)?,
            hop_length: usize_of(stft, "hop_length", 160)?,
            n_fft: usize_of(stft, "filter_length", 1024)?,
            mel_bins,
        };
        if cfg.ch_mult.is_empty() || cfg.ch == 0 || cfg.z_channels == 0 || cfg.hop_length == 0 {
            return Err("ch, ch_mult, z_channels and hop_length must not be empty or zero".into());
        }
        if cfg.n_fft < 2 || cfg.mel_bins == 0 {
            return Err("filter_length and the mel bins must be positive".into());
        }
        Ok(cfg)
    }

    /// The mel bins of a latent frame (the mel bins halved per downsampling level).
    pub fn latent_mel_bins(&self) -> usize {
        let mut f = self.mel_bins;
        for _ in 1..self.ch_mult.len() {
            f = f.div_ceil(2);
        }
        f
    }

    /// Spectrogram frames of `latent_frames` latent frames once decoded (`AudioDecoder`'s target length).
    pub fn decoded_frames(&self, latent_frames: usize) -> usize {
        let t = latent_frames * LATENT_DOWNSAMPLE_FACTOR;
        if self.causality == Causality::None {
            t
        } else {
            t.saturating_sub(LATENT_DOWNSAMPLE_FACTOR - 1).max(1)
        }
    }
}

/// The snake activation of a BigVGAN v2 generator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Snake {
    Snake,
    SnakeBeta,
}

/// One mel-to-waveform generator (`Vocoder`).
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratorConfig {
    pub resblock_kernel_sizes: Vec<usize>,
    pub upsample_rates: Vec<usize>,
    pub upsample_kernel_sizes: Vec<usize>,
    pub resblock_dilation_sizes: Vec<Vec<usize>>,
    pub upsample_initial_channel: usize,
    /// `AMP1` blocks with anti-aliased snake activations (`Some`), or `ResBlock1` with leaky ReLU (`None`).
    pub amp: Option<Snake>,
    pub output_sampling_rate: usize,
    pub use_tanh_at_final: bool,
    pub apply_final_activation: bool,
    pub use_bias_at_final: bool,
}

/// The bandwidth extension of LTX-2.3's vocoder (`bwe` section).
#[derive(Debug, Clone, PartialEq)]
pub struct BweConfig {
    pub generator: GeneratorConfig,
    pub input_sampling_rate: usize,
    pub output_sampling_rate: usize,
    pub hop_length: usize,
    pub n_fft: usize,
    pub num_mels: usize,
}

/// The vocoder: LTX-2's plain generator, or LTX-2.3's generator followed by bandwidth extension.
#[derive(Debug, Clone, PartialEq)]
pub struct VocoderConfig {
    pub vocoder: GeneratorConfig,
    pub bwe: Option<BweConfig>,
}

fn check(section: &Value, key: &str, want: &Value) -> Result<(), String> {
    match section.get(key) {
        Some(v) if v != want => Err(format!("vocoder `{key}` is {v}, only {want} is supported")),
        _ => Ok(()),
    }
}

fn generator(
    v: &Value,
    apply_final_activation: bool,
    output_sampling_rate: Option<usize>,
) -> Result<GeneratorConfig, String> {
    let dilations = match v.get("resblock_dilation_sizes") {
        None => vec![vec![1, 3, 5]; 3],
        Some(Value::Array(rows)) => rows
            .iter()
            .map(|r| {
                r.as_array()
                    .and_then(|r| r.iter().map(|x| x.as_u64().map(|n| n as usize)).collect())
                    .ok_or_else(|| {
                        format!("resblock_dilation_sizes holds {r}, expected lists of numbers")
                    })
            })
            .collect::<Result<_, _>>()?,
        Some(x) => return Err(format!("resblock_dilation_sizes is {x}, expected a list")),
    };
    let resblock = str_of(v, "resblock", "1")?;
    let amp = match resblock {
        "1" => None,
        "AMP1" => Some(match str_of(v, "activation", "snake")? {
            "snakebeta" => Snake::SnakeBeta,
            _ => Snake::Snake,
        }),
        other => {
            return Err(format!(
                "vocoder resblock `{other}` is not supported (1, AMP1)"
            ))
        }
    };
    let cfg = GeneratorConfig {
        resblock_kernel_sizes: list_of(v, "resblock_kernel_sizes", &[3, 7, 11])?,
        upsample_rates: list_of(v, "upsample_rates", &[6, 5, 2, 2, 2])?,
        upsample_kernel_sizes: list_of(v, "upsample_kernel_sizes", &[16, 15, 8, 4, 4])?,
        resblock_dilation_sizes: dilations,
        upsample_initial_channel: usize_of(v, "upsample_initial_channel", 1024)?,
        amp,
        output_sampling_rate: match output_sampling_rate {
            Some(r) => r,
            None => usize_of(v, "output_sampling_rate", 24000)?,
        },
        use_tanh_at_final: bool_of(v, "use_tanh_at_final", true)?,
        apply_final_activation,
        use_bias_at_final: bool_of(v, "use_bias_at_final", true)?,
    };
    if cfg.upsample_rates.len() != cfg.upsample_kernel_sizes.len()
        || cfg.resblock_kernel_sizes.len() != cfg.resblock_dilation_sizes.len()
        || cfg.resblock_dilation_sizes.iter().any(|d| d.len() != 3)
        || cfg.resblock_kernel_sizes.is_empty()
    {
        return Err(
            "the vocoder's upsample rates and kernels, and its resblock kernels and dilations (3 each), must pair up"
                .into(),
        );
    }
    if cfg.upsample_initial_channel >> cfg.upsample_rates.len() == 0 {
        return Err("upsample_initial_channel is too small for the number of upsamplings".into());
    }
    Ok(cfg)
}

impl VocoderConfig {
    /// From the `vocoder` section of a checkpoint's `config` metadata.
    pub fn from_json(section: &Value) -> Result<Self, String> {
        let Some(bwe) = section.get("bwe") else {
            check(section, "resblock", &Value::from("1"))?;
            check(section, "stereo", &Value::Bool(true))?;
            return Ok(Self {
                vocoder: generator(section, true, None)?,
                bwe: None,
            });
        };
        let null = Value::Null;
        let inner = section.get("vocoder").unwrap_or(&null);
        for part in [inner, bwe] {
            check(part, "resblock", &Value::from("AMP1"))?;
            check(part, "stereo", &Value::Bool(true))?;
            check(part, "activation", &Value::from("snakebeta"))?;
        }
        let need = |key: &str| -> Result<usize, String> {
            bwe.get(key)
                .and_then(Value::as_u64)
                .map(|n| n as usize)
                .ok_or_else(|| format!("the vocoder's `bwe` section has no `{key}`"))
        };
        let (rate_in, rate_out) = (need("input_sampling_rate")?, need("output_sampling_rate")?);
        if rate_in == 0 || rate_out % rate_in != 0 {
            return Err(format!(
                "the bandwidth extension goes from {rate_in} Hz to {rate_out} Hz, not a whole multiple"
            ));
        }
        let cfg = BweConfig {
            generator: generator(bwe, false, Some(rate_out))?,
            input_sampling_rate: rate_in,
            output_sampling_rate: rate_out,
            hop_length: need("hop_length")?,
            n_fft: need("n_fft")?,
            num_mels: need("num_mels")?,
        };
        if cfg.hop_length == 0 || cfg.n_fft < cfg.hop_length {
            return Err(
                "the bandwidth extension's hop_length must be positive and at most n_fft".into(),
            );
        }
        Ok(Self {
            vocoder: generator(inner, true, Some(rate_in))?,
            bwe: Some(cfg),
        })
    }

    /// The sample rate of the waveform it makes.
    pub fn output_sampling_rate(&self) -> usize {
        match &self.bwe {
            Some(b) => b.output_sampling_rate,
            None => self.vocoder.output_sampling_rate,
        }
    }
}
