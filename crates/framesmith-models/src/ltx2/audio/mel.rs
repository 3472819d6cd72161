//! The log-mel spectrogram the audio VAE encodes (ltx-core's `AudioProcessor.waveform_to_mel`: torchaudio's
//! `MelSpectrogram` with a periodic Hann window as long as the FFT, centred frames with reflect padding, the
//! magnitude (power 1), Slaney's mel scale and area normalisation from 0 Hz to Nyquist, then `log(max(·, 1e-5))`).
//! The short-time transform is a product with a windowed DFT basis built once in f64, so it runs on whatever
//! device the tensors are on.

use candle_core::{DType, Device, Result, Tensor};

/// Slaney's mel scale (`_hz_to_mel(…, "slaney")`): linear below 1 kHz, logarithmic above.
fn hz_to_mel(hz: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    let min_log_mel = 1000.0 / f_sp;
    let logstep = 6.4f64.ln() / 27.0;
    if hz >= 1000.0 {
        min_log_mel + (hz / 1000.0).ln() / logstep
    } else {
        hz / f_sp
    }
}

fn mel_to_hz(mel: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    let min_log_mel = 1000.0 / f_sp;
    let logstep = 6.4f64.ln() / 27.0;
    if mel >= min_log_mel {
        1000.0 * (logstep * (mel - min_log_mel)).exp()
    } else {
        f_sp * mel
    }
}

fn linspace(a: f64, b: f64, n: usize) -> Vec<f64> {
    if n == 1 {
        return vec![a];
    }
    (0..n)
        .map(|i| a + (b - a) * i as f64 / (n - 1) as f64)
        .collect()
}

/// torchaudio's `melscale_fbanks(n_freqs, 0, sample_rate / 2, n_mels, sample_rate, "slaney", "slaney")`,
/// row-major [n_freqs, n_mels].
pub fn slaney_filterbank(n_freqs: usize, n_mels: usize, sample_rate: usize) -> Vec<f64> {
    let all_freqs = linspace(0.0, (sample_rate / 2) as f64, n_freqs);
    let m_max = hz_to_mel(sample_rate as f64 / 2.0);
    let f_pts: Vec<f64> = linspace(hz_to_mel(0.0), m_max, n_mels + 2)
        .into_iter()
        .map(mel_to_hz)
        .collect();
    let mut fb = vec![0.0; n_freqs * n_mels];
    for (i, &f) in all_freqs.iter().enumerate() {
        for m in 0..n_mels {
            let down = (f - f_pts[m]) / (f_pts[m + 1] - f_pts[m]);
            let up = (f_pts[m + 2] - f) / (f_pts[m + 2] - f_pts[m + 1]);
            let enorm = 2.0 / (f_pts[m + 2] - f_pts[m]);
            fb[i * n_mels + m] = down.min(up).max(0.0) * enorm;
        }
    }
    fb
}

/// The waveform-to-log-mel transform of one audio VAE.
pub struct MelSpectrogram {
    n_fft: usize,
    hop: usize,
    /// [n_fft, 2·n_freqs]: the Hann-windowed cosines, then the sines.
    basis: Tensor,
    /// [n_freqs, n_mels].
    filters: Tensor,
}

impl MelSpectrogram {
    /// The transform at `sample_rate` with an FFT of `n_fft` samples every `hop`, into `n_mels` bins, on `device`.
    pub fn new(
        sample_rate: usize,
        n_fft: usize,
        hop: usize,
        n_mels: usize,
        device: &Device,
    ) -> Result<Self> {
        let n_freqs = n_fft / 2 + 1;
        let mut basis = vec![0f32; n_fft * 2 * n_freqs];
        for n in 0..n_fft {
            let window = 0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / n_fft as f64).cos();
            for k in 0..n_freqs {
                // (k·n mod N) keeps the angle small, so the f64 sines stay exact for long FFTs.
                let angle = 2.0 * std::f64::consts::PI * ((k * n) % n_fft) as f64 / n_fft as f64;
                basis[n * 2 * n_freqs + k] = (window * angle.cos()) as f32;
                basis[n * 2 * n_freqs + n_freqs + k] = (-window * angle.sin()) as f32;
            }
        }
        let filters: Vec<f32> = slaney_filterbank(n_freqs, n_mels, sample_rate)
            .into_iter()
            .map(|v| v as f32)
            .collect();
        Ok(Self {
            n_fft,
            hop,
            basis: Tensor::from_vec(basis, (n_fft, 2 * n_freqs), device)?,
            filters: Tensor::from_vec(filters, (n_freqs, n_mels), device)?,
        })
    }

    /// Frames of a waveform of `samples` samples (`1 + samples / hop`).
    pub fn frames(&self, samples: usize) -> usize {
        1 + samples / self.hop
    }

    /// Log-mel [b, c, frames, n_mels] (f32) of `waveform` [b, c, samples], which must be longer than half the FFT
    /// (reflect padding needs it).
    pub fn forward(&self, waveform: &Tensor) -> Result<Tensor> {
        let (b, c, n) = waveform.dims3()?;
        let pad = self.n_fft / 2;
        if n <= pad {
            candle_core::bail!(
                "audio of {n} samples is too short for the mel spectrogram: it needs more than {pad}"
            );
        }
        let frames = self.frames(n);
        // Sample index of every tap of every frame in the centred, reflect-padded signal.
        let mut index = Vec::with_capacity(frames * self.n_fft);
        for f in 0..frames {
            for k in 0..self.n_fft {
                let i = (f * self.hop + k) as i64 - pad as i64;
                let i = if i < 0 {
                    -i
                } else if i >= n as i64 {
                    2 * (n as i64 - 1) - i
                } else {
                    i
                };
                index.push(i as u32);
            }
        }
        let index = Tensor::from_vec(index, frames * self.n_fft, waveform.device())?;
        let x = waveform.to_dtype(DType::F32)?.reshape((b * c, n))?;
        let taps = x
            .index_select(&index, 1)?
            .reshape((b * c * frames, self.n_fft))?;
        let spec = taps.matmul(&self.basis)?;
        let n_freqs = self.n_fft / 2 + 1;
        let re = spec.narrow(1, 0, n_freqs)?;
        let im = spec.narrow(1, n_freqs, n_freqs)?;
        let magnitude = (re.sqr()? + im.sqr()?)?.sqrt()?;
        let mel = magnitude.matmul(&self.filters)?;
        let n_mels = mel.dim(1)?;
        mel.maximum(1e-5)?.log()?.reshape((b, c, frames, n_mels))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slaney_scale_round_trips_and_filters_cover_the_band() {
        for hz in [0.0, 440.0, 999.0, 1000.0, 4321.0, 8000.0] {
            assert!((mel_to_hz(hz_to_mel(hz)) - hz).abs() < 1e-9, "{hz}");
        }
        let fb = slaney_filterbank(513, 64, 16000);
        for m in 0..64 {
            let column: f64 = (0..513).map(|i| fb[i * 64 + m]).sum();
            assert!(column > 0.0, "mel filter {m} is empty");
        }
    }
}
