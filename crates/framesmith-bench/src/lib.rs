//! GPU benchmarks (`framesmith-bench attention|linear|kernels|step|check`): random inputs of Wan shapes, median
//! time over timed repetitions, TFLOP/s and peak pool memory, printed as a table and as `BENCH {json}` lines that
//! `bench/reference/compare.py` joins with PyTorch's numbers from the same run; and a synthetic training project of
//! a real size (`synth` for Wan, `synth_flux` for FLUX.1 [dev],
//! `synth_qwen_image` for Qwen-Image, `synth_hunyuan_video15` for HunyuanVideo 1.5, `synth_ltx2` for LTX-2.3). No training
//! code depends on this.

pub mod attention;
#[cfg(feature = "cudnn")]
pub mod attention_fp8;
pub mod equivalence;
#[cfg(feature = "cuda")]
pub mod kernels;
pub mod linear;
pub mod step;
pub mod stream;
pub mod synth;
pub mod synth_flux;
pub mod synth_flux_samples;
pub mod synth_hunyuan_video15;
pub mod synth_hunyuan_video15_samples;
pub mod synth_ltx2;
pub mod synth_ltx2_text;
pub mod synth_qwen_image;

use candle_core::{Device, Result};
use serde::Serialize;

/// One measured case, in the form the PyTorch references print too.
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    /// `attention` or `linear`.
    pub bench: String,
    /// The case within the bench (`self`, `cross`, `qkvo bf16`, …).
    pub case: String,
    /// What was timed (`fwd`, `fwd+bwd`, …).
    pub pass: String,
    /// The shape, spelt out (`b=1 h=40 lq=32760 lk=32760 d=128`).
    pub shape: String,
    /// `framesmith` (this binary) or the reference's name.
    pub implementation: String,
    /// Median milliseconds over the timed repetitions.
    pub ms: f64,
    /// Floating-point operations of one repetition divided by the median time.
    pub tflops: f64,
    /// Peak device memory allocated during the timed repetitions, above what was allocated before them (GiB);
    /// `None` where the device cannot say.
    pub peak_gib: Option<f64>,
}

impl Record {
    /// The line the comparison script reads.
    pub fn json_line(&self) -> String {
        format!("BENCH {}", serde_json::to_string(self).unwrap_or_default())
    }
}

/// Timing of one case.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Median milliseconds.
    pub median_ms: f64,
    /// Peak memory above the starting point, bytes, when known.
    pub peak_bytes: Option<u64>,
}

/// Times `f` `iters` times after `warmup` untimed calls, each repetition bracketed by device events on CUDA
/// (host clock and a synchronize elsewhere), and returns the median.
pub fn time<F: FnMut() -> Result<()>>(
    dev: &Device,
    warmup: usize,
    iters: usize,
    mut f: F,
) -> Result<Timing> {
    for _ in 0..warmup {
        f()?;
    }
    dev.synchronize()?;
    let start_peak = peak::reset(dev)?;
    let mut samples = Vec::with_capacity(iters);
    for _ in 0..iters.max(1) {
        samples.push(timed_once(dev, &mut f)?);
    }
    let peak_bytes = peak::read(dev, start_peak)?;
    samples.sort_by(f64::total_cmp);
    Ok(Timing {
        median_ms: samples[samples.len() / 2],
        peak_bytes,
    })
}

/// A case for [`time_interleaved`].
pub type Case<'a> = &'a mut dyn FnMut() -> Result<()>;

/// Times several cases in round-robin (one repetition of each in turn), so that clock and power changes during
/// the run affect them alike and their ratios are stable; peak memory is taken from one separate call of each.
pub fn time_interleaved(
    dev: &Device,
    warmup: usize,
    iters: usize,
    cases: &mut [Case],
) -> Result<Vec<Timing>> {
    let mut peaks = Vec::with_capacity(cases.len());
    for f in cases.iter_mut() {
        f()?;
        dev.synchronize()?;
        let base = peak::reset(dev)?;
        f()?;
        dev.synchronize()?;
        peaks.push(peak::read(dev, base)?);
    }
    for _ in 0..warmup {
        for f in cases.iter_mut() {
            f()?;
        }
    }
    let mut samples = vec![Vec::with_capacity(iters); cases.len()];
    for _ in 0..iters.max(1) {
        for (f, s) in cases.iter_mut().zip(&mut samples) {
            s.push(timed_once(dev, f)?);
        }
    }
    Ok(samples
        .into_iter()
        .zip(peaks)
        .map(|(mut s, peak_bytes)| {
            s.sort_by(f64::total_cmp);
            Timing {
                median_ms: s[s.len() / 2],
                peak_bytes,
            }
        })
        .collect())
}

#[cfg(feature = "cuda")]
fn timed_once<F: FnMut() -> Result<()>>(dev: &Device, f: &mut F) -> Result<f64> {
    use framesmith_nn::cuda::device::EventTimer;
    match dev {
        Device::Cuda(cuda) => {
            let timer = EventTimer::start(cuda)?;
            f()?;
            timer.stop(cuda)
        }
        _ => host_timed_once(dev, f),
    }
}

#[cfg(not(feature = "cuda"))]
fn timed_once<F: FnMut() -> Result<()>>(dev: &Device, f: &mut F) -> Result<f64> {
    host_timed_once(dev, f)
}

fn host_timed_once<F: FnMut() -> Result<()>>(dev: &Device, f: &mut F) -> Result<f64> {
    let t = std::time::Instant::now();
    f()?;
    dev.synchronize()?;
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

#[cfg(feature = "cuda")]
mod peak {
    use candle_core::{Device, Result};
    use framesmith_nn::cuda::device;

    /// Restarts the pool's high-water mark; returns the bytes in use now (the baseline).
    pub fn reset(dev: &Device) -> Result<Option<u64>> {
        match dev {
            Device::Cuda(cuda) => {
                device::reset_peak_memory(cuda)?;
                Ok(Some(device::used_memory_bytes(cuda)?))
            }
            _ => Ok(None),
        }
    }

    /// Peak bytes above the baseline.
    pub fn read(dev: &Device, baseline: Option<u64>) -> Result<Option<u64>> {
        match (dev, baseline) {
            (Device::Cuda(cuda), Some(base)) => {
                Ok(Some(device::peak_memory_bytes(cuda)?.saturating_sub(base)))
            }
            _ => Ok(None),
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod peak {
    use candle_core::{Device, Result};

    pub fn reset(_: &Device) -> Result<Option<u64>> {
        Ok(None)
    }

    pub fn read(_: &Device, _: Option<u64>) -> Result<Option<u64>> {
        Ok(None)
    }
}

/// Builds a record from a timing and the operation count of one repetition.
pub fn record(bench: &str, case: &str, pass: &str, shape: &str, flops: f64, t: Timing) -> Record {
    Record {
        bench: bench.into(),
        case: case.into(),
        pass: pass.into(),
        shape: shape.into(),
        implementation: "framesmith".into(),
        ms: t.median_ms,
        tflops: flops / (t.median_ms * 1e-3) / 1e12,
        peak_gib: t.peak_bytes.map(|b| b as f64 / (1u64 << 30) as f64),
    }
}

/// A fixed-width table of records, for people; the JSON lines are for the comparison script.
pub fn table(records: &[Record]) -> String {
    let mut out = format!(
        "{:<10} {:<22} {:<10} {:<44} {:>10} {:>9} {:>9}\n",
        "bench", "case", "pass", "shape", "ms", "TFLOP/s", "peak GiB"
    );
    for r in records {
        let peak = r.peak_gib.map_or("-".to_string(), |p| format!("{p:.2}"));
        out.push_str(&format!(
            "{:<10} {:<22} {:<10} {:<44} {:>10.3} {:>9.1} {:>9}\n",
            r.bench, r.case, r.pass, r.shape, r.ms, r.tflops, peak
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_returns_the_median_and_records_serialise() -> Result<()> {
        let mut calls = 0;
        let t = time(&Device::Cpu, 1, 5, || {
            calls += 1;
            Ok(())
        })?;
        assert_eq!(calls, 6);
        assert!(t.median_ms >= 0.0);
        let r = record(
            "attention",
            "self",
            "fwd",
            "b=1",
            2e9,
            Timing {
                median_ms: 2.0,
                peak_bytes: None,
            },
        );
        assert!((r.tflops - 1.0).abs() < 1e-12, "{}", r.tflops);
        let line = r.json_line();
        assert!(
            line.starts_with("BENCH {") && line.contains("\"ms\":2.0"),
            "{line}"
        );
        assert!(table(&[r]).lines().count() == 2);
        Ok(())
    }
}
