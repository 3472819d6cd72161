//! Loading a Wan DiT, the one path training and `generate` share. A file is opened, not loaded: each tensor is
//! read from the file as its block is built (resident blocks go to the device, streamed ones into their
//! host buffers), so neither the GPU nor RAM ever holds the whole file on top of the model.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use candle_core::{DType, Device};

use framesmith_models::wan::config::Expert;
use framesmith_models::wan::weights;
use framesmith_models::wan::{ModelOptions, WanConfig, WanModel};
use framesmith_nn::offload::{OffloadOptions, OutOfMemory};
use framesmith_nn::vb::Vb;

/// The blocks that stream from host RAM and the ring's settings; `None` keeps every block on the device.
pub type Streaming = Option<(Vec<usize>, OffloadOptions)>;

/// A DiT as [`load_dit`] built it.
pub struct LoadedDit {
    pub model: WanModel,
    /// The variant's display name (`Wan2.1 T2V-14B`, `Wan2.2 T2V-A14B high-noise expert`).
    pub name: String,
    /// The Wan2.2 A14B expert, when the path or the file names one.
    pub expert: Option<Expert>,
}

/// The DiT file at `path` (checked against `expected` when given), built in `dtype` on `device`.
/// `on_open` is called with the file's configuration and variant name (`t2v-14b`, …) before anything is built,
/// and says which blocks stream.
pub fn load_dit(
    path: &Path,
    expected: Option<&WanConfig>,
    (dtype, device): (DType, &Device),
    options: &ModelOptions,
    on_open: impl FnOnce(&WanConfig, &str) -> anyhow::Result<Streaming>,
) -> anyhow::Result<LoadedDit> {
    let loaded = weights::open(path, expected)?;
    let name = weights::variant_name(&loaded.config, loaded.expert);
    let streaming = on_open(&loaded.config, &name)?;
    let vb = Vb::from_source(Arc::new(loaded.tensors), dtype, device);
    let model = build_dit(&loaded.config, vb, options, streaming)
        .with_context(|| format!("building the DiT from {}", path.display()))?;
    Ok(LoadedDit {
        model,
        name,
        expert: loaded.expert,
    })
}

/// `cfg`'s DiT from the weights `vb` reads, with `streaming`'s blocks in host RAM. A device allocation failure
/// comes back as [`OutOfMemory`].
pub fn build_dit(
    cfg: &WanConfig,
    vb: Vb,
    options: &ModelOptions,
    streaming: Streaming,
) -> anyhow::Result<WanModel> {
    match streaming {
        Some((streamed, offload)) => WanModel::new_streamed(cfg, vb, options, &streamed, &offload),
        None => WanModel::new(cfg, vb, options),
    }
    .map_err(|err| match OutOfMemory::classify(err) {
        Ok(oom) => oom.into(),
        Err(err) => err.into(),
    })
}
