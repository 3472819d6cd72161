//! The vocoders of LTX-2 and LTX-2.3 as ltx-core writes them (`audio_vae/vocoder.py`, `resnet.py`): the HiFi-GAN
//! style `Vocoder` (stereo mel [b, 2, t, 64] as 128 channels, transposed-convolution upsamplers, the mean of
//! `ResBlock1`s with leaky ReLU, or of BigVGAN v2 `AMPBlock1`s with anti-aliased snake activations, then tanh or a
//! clamp), and LTX-2.3's `VocoderWithBWE` (that vocoder, then a causal log-mel of its output from the stored STFT
//! bases and filterbank, a second generator predicting a residual added to a Hann-sinc upsampled copy, clamped).
//! The anti-aliasing filters are read from the file, as ltx-core loads them; the resampler's is built here.
//! Everything runs in f32, as the official BWE forward does.

use candle_core::{DType, Result, Tensor};

use super::config::{BweConfig, GeneratorConfig, Snake, VocoderConfig};
use framesmith_nn::vb::Vb;

const LRELU_SLOPE: f64 = 0.1;

fn leaky_relu(xs: &Tensor, slope: f64) -> Result<Tensor> {
    xs.maximum(&(xs * slope)?)
}

/// A `Conv1d` (keys `weight` [out, in, k], `bias`) with symmetric padding and dilation.
struct Conv1d {
    weight: Tensor,
    bias: Option<Tensor>,
    padding: usize,
    dilation: usize,
}

impl Conv1d {
    fn new(
        vb: &Vb,
        (c_in, c_out, k): (usize, usize, usize),
        dilation: usize,
        bias: bool,
    ) -> Result<Self> {
        Ok(Self {
            weight: vb.get((c_out, c_in, k), "weight")?.to_dtype(DType::F32)?,
            bias: if bias {
                Some(vb.get(c_out, "bias")?.to_dtype(DType::F32)?)
            } else {
                None
            },
            padding: (k * dilation - dilation) / 2,
            dilation,
        })
    }

    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let ys = xs.conv1d(&self.weight, self.padding, 1, self.dilation, 1)?;
        match &self.bias {
            Some(b) => ys.broadcast_add(&b.reshape((1, (), 1))?),
            None => Ok(ys),
        }
    }
}

/// A `ConvTranspose1d` upsampler (keys `weight` [in, out, k], `bias`) with padding (k − stride) / 2.
struct ConvTranspose1d {
    weight: Tensor,
    bias: Tensor,
    stride: usize,
    padding: usize,
}

impl ConvTranspose1d {
    fn new(vb: &Vb, (c_in, c_out): (usize, usize), k: usize, stride: usize) -> Result<Self> {
        if k < stride {
            candle_core::bail!("vocoder upsample kernel {k} is shorter than its rate {stride}");
        }
        Ok(Self {
            weight: vb.get((c_in, c_out, k), "weight")?.to_dtype(DType::F32)?,
            bias: vb.get(c_out, "bias")?.to_dtype(DType::F32)?,
            stride,
            padding: (k - stride) / 2,
        })
    }

    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        xs.conv_transpose1d(&self.weight, self.padding, 0, self.stride, 1, 1)?
            .broadcast_add(&self.bias.reshape((1, (), 1))?)
    }
}

/// `xs` [b, c, t] with its first and last samples repeated `left` and `right` times (`mode="replicate"`).
fn replicate(xs: &Tensor, left: usize, right: usize) -> Result<Tensor> {
    xs.pad_with_same(2, left, right)
}

/// One filter applied to every channel separately (a depthwise convolution), `xs` [b, c, t] → [b, c, t'].
fn depthwise(xs: &Tensor, f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    let (b, c, t) = xs.dims3()?;
    let ys = f(&xs.reshape((b * c, 1, t))?)?;
    let t_out = ys.dim(2)?;
    ys.reshape((b, c, t_out))
}

/// `UpSample1d`: replicate-pad, transposed convolution with `filter` [1, 1, k] at `ratio`, × ratio, trimmed.
struct UpSample1d {
    filter: Tensor,
    ratio: usize,
    pad: usize,
    trim: (usize, usize),
}

impl UpSample1d {
    /// The kaiser-sinc upsampler of an anti-aliased activation (ratio 2, its `filter` [1, 1, 12] from the file).
    fn kaiser(vb: &Vb) -> Result<Self> {
        let (ratio, k) = (2, 12);
        let pad = k / ratio - 1;
        Ok(Self {
            filter: vb.get((1, 1, k), "filter")?.to_dtype(DType::F32)?,
            ratio,
            pad,
            trim: (
                pad * ratio + (k - ratio) / 2,
                pad * ratio + (k - ratio).div_ceil(2),
            ),
        })
    }

    /// The Hann-windowed sinc upsampler of the bandwidth extension (`window_type="hann"`, torchaudio's
    /// `resample` kernel: 6 zero crossings, rolloff 0.99).
    fn hann(ratio: usize, device: &candle_core::Device) -> Result<Self> {
        let (rolloff, zeros) = (0.99f64, 6.0f64);
        let width = (zeros / rolloff).ceil() as usize;
        let k = 2 * width * ratio + 1;
        let filter: Vec<f32> = (0..k)
            .map(|i| {
                let t = (i as f64 / ratio as f64 - width as f64) * rolloff;
                let clamped = t.clamp(-zeros, zeros);
                let window = (clamped * std::f64::consts::PI / zeros / 2.0).cos().powi(2);
                let sinc = if t == 0.0 {
                    1.0
                } else {
                    (std::f64::consts::PI * t).sin() / (std::f64::consts::PI * t)
                };
                (sinc * window * rolloff / ratio as f64) as f32
            })
            .collect();
        Ok(Self {
            filter: Tensor::from_vec(filter, (1, 1, k), device)?,
            ratio,
            pad: width,
            trim: (2 * width * ratio, k - ratio),
        })
    }

    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let x = replicate(xs, self.pad, self.pad)?;
        let y = depthwise(&x, |x| {
            x.conv_transpose1d(&self.filter, 0, 0, self.ratio, 1, 1)
        })?;
        let y = (y * self.ratio as f64)?;
        let n = y.dim(2)?;
        y.narrow(2, self.trim.0, n - self.trim.0 - self.trim.1)
    }
}

/// `DownSample1d` (keys `lowpass.filter` [1, 1, 12]): replicate-pad 5 | 6, low-pass at stride 2.
struct DownSample1d {
    filter: Tensor,
}

impl DownSample1d {
    fn new(vb: &Vb) -> Result<Self> {
        Ok(Self {
            filter: vb
                .pp("lowpass")
                .get((1, 1, 12), "filter")?
                .to_dtype(DType::F32)?,
        })
    }

    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let x = replicate(xs, 5, 6)?;
        depthwise(&x, |x| x.conv1d(&self.filter, 0, 2, 1, 1))
    }
}

/// `Activation1d` around `Snake` / `SnakeBeta` (keys `act.alpha`, `act.beta`, `upsample.filter`,
/// `downsample.lowpass.filter`): upsample ×2, `x + sin²(x·e^α) / (e^β + 1e-9)` (β = α for `Snake`), downsample.
struct Activation {
    alpha: Tensor,
    inv_beta: Tensor,
    upsample: UpSample1d,
    downsample: DownSample1d,
}

impl Activation {
    fn new(vb: &Vb, c: usize, kind: Snake) -> Result<Self> {
        let act = vb.pp("act");
        let alpha = act.get(c, "alpha")?.to_dtype(DType::F32)?.exp()?;
        let beta = match kind {
            Snake::Snake => alpha.clone(),
            Snake::SnakeBeta => act.get(c, "beta")?.to_dtype(DType::F32)?.exp()?,
        };
        Ok(Self {
            alpha: alpha.reshape((1, c, 1))?,
            inv_beta: (beta + 1e-9)?.recip()?.reshape((1, c, 1))?,
            upsample: UpSample1d::kaiser(&vb.pp("upsample"))?,
            downsample: DownSample1d::new(&vb.pp("downsample"))?,
        })
    }

    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let x = self.upsample.forward(xs)?;
        let s = x.broadcast_mul(&self.alpha)?.sin()?.sqr()?;
        let x = (x + s.broadcast_mul(&self.inv_beta)?)?;
        self.downsample.forward(&x)
    }
}

/// `ResBlock1` (leaky ReLU) or `AMPBlock1` (anti-aliased snakes): three dilated convolutions, each followed by
/// an undilated one, each pair residual.
struct ResBlock {
    convs1: Vec<Conv1d>,
    convs2: Vec<Conv1d>,
    acts: Option<Vec<(Activation, Activation)>>,
}

impl ResBlock {
    fn new(vb: &Vb, c: usize, k: usize, dilations: &[usize], amp: Option<Snake>) -> Result<Self> {
        let mut convs1 = Vec::new();
        let mut convs2 = Vec::new();
        let mut acts = amp.map(|_| Vec::new());
        for (i, &d) in dilations.iter().enumerate() {
            convs1.push(Conv1d::new(&vb.pp("convs1").pp(i), (c, c, k), d, true)?);
            convs2.push(Conv1d::new(&vb.pp("convs2").pp(i), (c, c, k), 1, true)?);
            if let (Some(acts), Some(kind)) = (acts.as_mut(), amp) {
                acts.push((
                    Activation::new(&vb.pp("acts1").pp(i), c, kind)?,
                    Activation::new(&vb.pp("acts2").pp(i), c, kind)?,
                ));
            }
        }
        Ok(Self {
            convs1,
            convs2,
            acts,
        })
    }

    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let mut x = xs.clone();
        for (i, (c1, c2)) in self.convs1.iter().zip(&self.convs2).enumerate() {
            let xt = match &self.acts {
                Some(acts) => {
                    let (a1, a2) = &acts[i];
                    c2.forward(&a2.forward(&c1.forward(&a1.forward(&x)?)?)?)?
                }
                None => {
                    let xt = c1.forward(&leaky_relu(&x, LRELU_SLOPE)?)?;
                    c2.forward(&leaky_relu(&xt, LRELU_SLOPE)?)?
                }
            };
            x = (x + xt)?;
        }
        Ok(x)
    }
}

/// One `Vocoder` generator: mel [b, 2, t, 64] → waveform [b, 2, t·∏rates].
struct Generator {
    cfg: GeneratorConfig,
    conv_pre: Conv1d,
    ups: Vec<ConvTranspose1d>,
    resblocks: Vec<Vec<ResBlock>>,
    act_post: Option<Activation>,
    conv_post: Conv1d,
}

impl Generator {
    fn new(vb: &Vb, cfg: &GeneratorConfig) -> Result<Self> {
        let c0 = cfg.upsample_initial_channel;
        let mut ups = Vec::new();
        let mut resblocks = Vec::new();
        for (i, (&rate, &k)) in cfg
            .upsample_rates
            .iter()
            .zip(&cfg.upsample_kernel_sizes)
            .enumerate()
        {
            let (c_in, c_out) = (c0 >> i, c0 >> (i + 1));
            ups.push(ConvTranspose1d::new(
                &vb.pp("ups").pp(i),
                (c_in, c_out),
                k,
                rate,
            )?);
            let mut level = Vec::new();
            for (j, (&rk, dil)) in cfg
                .resblock_kernel_sizes
                .iter()
                .zip(&cfg.resblock_dilation_sizes)
                .enumerate()
            {
                let index = i * cfg.resblock_kernel_sizes.len() + j;
                level.push(ResBlock::new(
                    &vb.pp("resblocks").pp(index),
                    c_out,
                    rk,
                    dil,
                    cfg.amp,
                )?);
            }
            resblocks.push(level);
        }
        let c_last = c0 >> cfg.upsample_rates.len();
        let act_post = match cfg.amp {
            Some(_) => Some(Activation::new(
                &vb.pp("act_post"),
                c_last,
                Snake::SnakeBeta,
            )?),
            None => None,
        };
        Ok(Self {
            cfg: cfg.clone(),
            conv_pre: Conv1d::new(&vb.pp("conv_pre"), (128, c0, 7), 1, true)?,
            ups,
            resblocks,
            act_post,
            conv_post: Conv1d::new(
                &vb.pp("conv_post"),
                (c_last, 2, 7),
                1,
                cfg.use_bias_at_final,
            )?,
        })
    }

    fn forward(&self, mel: &Tensor) -> Result<Tensor> {
        let (b, s, t, m) = mel.dims4()?;
        if s * m != 128 {
            candle_core::bail!(
                "the vocoder takes stereo mel [b, 2, t, 64], got {:?}",
                mel.dims()
            );
        }
        let x = mel
            .to_dtype(DType::F32)?
            .transpose(2, 3)?
            .reshape((b, s * m, t))?;
        let mut x = self.conv_pre.forward(&x)?;
        for (up, level) in self.ups.iter().zip(&self.resblocks) {
            if self.cfg.amp.is_none() {
                x = leaky_relu(&x, LRELU_SLOPE)?;
            }
            x = up.forward(&x)?;
            let mut sum = level[0].forward(&x)?;
            for block in &level[1..] {
                sum = (sum + block.forward(&x)?)?;
            }
            x = (sum / level.len() as f64)?;
        }
        let x = match &self.act_post {
            Some(a) => a.forward(&x)?,
            // `nn.LeakyReLU()`: its default slope.
            None => leaky_relu(&x, 0.01)?,
        };
        let x = self.conv_post.forward(&x)?;
        if !self.cfg.apply_final_activation {
            Ok(x)
        } else if self.cfg.use_tanh_at_final {
            x.tanh()
        } else {
            x.clamp(-1f32, 1f32)
        }
    }
}

/// The bandwidth extension: the causal log-mel (`mel_stft.*`), the second generator (`bwe_generator.*`) and the
/// resampled skip.
struct Bwe {
    cfg: BweConfig,
    forward_basis: Tensor,
    mel_basis: Tensor,
    generator: Generator,
    resampler: UpSample1d,
}

impl Bwe {
    fn new(vb: &Vb, cfg: &BweConfig) -> Result<Self> {
        let n_freqs = cfg.n_fft / 2 + 1;
        let stft = vb.pp("mel_stft");
        Ok(Self {
            cfg: cfg.clone(),
            forward_basis: stft
                .pp("stft_fn")
                .get((2 * n_freqs, 1, cfg.n_fft), "forward_basis")?
                .to_dtype(DType::F32)?,
            mel_basis: stft
                .get((cfg.num_mels, n_freqs), "mel_basis")?
                .to_dtype(DType::F32)?,
            generator: Generator::new(&vb.pp("bwe_generator"), &cfg.generator)?,
            resampler: UpSample1d::hann(
                cfg.output_sampling_rate / cfg.input_sampling_rate,
                vb.device(),
            )?,
        })
    }

    /// The log-mel [b, c, frames, mels] of `xs` [b, c, t] (`MelSTFT.mel_spectrogram`, transposed as the generator
    /// takes it).
    fn mel(&self, xs: &Tensor) -> Result<Tensor> {
        let (b, c, t) = xs.dims3()?;
        let left = self.cfg.n_fft - self.cfg.hop_length;
        let y = xs.reshape((b * c, 1, t))?.pad_with_zeros(2, left, 0)?;
        let spec = y.conv1d(&self.forward_basis, 0, self.cfg.hop_length, 1, 1)?;
        let n_freqs = spec.dim(1)? / 2;
        let re = spec.narrow(1, 0, n_freqs)?;
        let im = spec.narrow(1, n_freqs, n_freqs)?;
        let magnitude = (re.sqr()? + im.sqr()?)?.sqrt()?;
        let mel = self
            .mel_basis
            .unsqueeze(0)?
            .broadcast_as((b * c, self.cfg.num_mels, n_freqs))?
            .contiguous()?
            .matmul(&magnitude)?;
        let mel = mel.maximum(1e-5)?.log()?;
        let frames = mel.dim(2)?;
        mel.reshape((b, c, self.cfg.num_mels, frames))?
            .transpose(2, 3)
    }

    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let t = xs.dim(2)?;
        let out_len = t * self.cfg.output_sampling_rate / self.cfg.input_sampling_rate;
        let hop = self.cfg.hop_length;
        let x = xs.pad_with_zeros(2, 0, (hop - t % hop) % hop)?;
        let residual = self.generator.forward(&self.mel(&x)?)?;
        let skip = self.resampler.forward(&x)?;
        if residual.dims() != skip.dims() {
            candle_core::bail!(
                "the bandwidth extension's residual {:?} and skip {:?} differ: its upsample rates must multiply to \
                 hop_length × the rate ratio",
                residual.dims(),
                skip.dims()
            );
        }
        (residual + skip)?.clamp(-1f32, 1f32)?.narrow(2, 0, out_len)
    }
}

/// LTX-2's vocoder, or LTX-2.3's with bandwidth extension (frozen; inference only).
pub struct Vocoder {
    cfg: VocoderConfig,
    vocoder: Generator,
    bwe: Option<Bwe>,
}

impl Vocoder {
    /// Builds the vocoder from ltx-core's key names under `vb` (the file's `vocoder.` stripped): `conv_pre`, …
    /// for LTX-2; `vocoder.*`, `bwe_generator.*`, `mel_stft.*` for LTX-2.3.
    pub fn new(cfg: &VocoderConfig, vb: &Vb) -> Result<Self> {
        Ok(match &cfg.bwe {
            None => Self {
                cfg: cfg.clone(),
                vocoder: Generator::new(vb, &cfg.vocoder)?,
                bwe: None,
            },
            Some(b) => Self {
                cfg: cfg.clone(),
                vocoder: Generator::new(&vb.pp("vocoder"), &cfg.vocoder)?,
                bwe: Some(Bwe::new(vb, b)?),
            },
        })
    }

    /// The sample rate of the waveforms it makes.
    pub fn output_sampling_rate(&self) -> usize {
        self.cfg.output_sampling_rate()
    }

    /// The waveform [b, 2, samples] (f32, in [−1, 1]) of a stereo spectrogram `mel` [b, 2, t, 64].
    pub fn forward(&self, mel: &Tensor) -> Result<Tensor> {
        let x = self.vocoder.forward(mel)?;
        match &self.bwe {
            Some(b) => b.forward(&x),
            None => Ok(x),
        }
    }
}
