//! `Vb`: a read-only view of named checkpoint tensors with a key prefix, so model code reads straight down the
//! key tree (`Block::new(cfg, vb.pp("self_attn").pp("q"))`). Knows nothing of file formats: loaders fill it, with
//! a map of tensors or with a [`TensorSource`] that reads each tensor only when it is asked for (so a model is
//! built block by block from a file, never holding the whole file in memory).

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::{DType, Device, Result, Shape, Tensor};

use super::fp8::Fp8Scale;
use super::load_timing::{timed, LoadPart};

/// Where a [`Vb`]'s tensors come from: each read by its full (official) name.
pub trait TensorSource: Send + Sync {
    /// Whether a tensor is stored under `key`.
    fn contains(&self, key: &str) -> bool;
    /// The tensor stored under `key`, dtype as stored, wherever the source keeps it (a file source reads it into
    /// host memory); `None` when there is none.
    fn read(&self, key: &str) -> Result<Option<Tensor>>;
    /// The tensor under `key` when the module asking knows its shape ([`Vb::get`]): a file source reads it as
    /// [`TensorSource::read`] does; [`ShapeRecorder`] makes it.
    fn read_shaped(&self, key: &str, shape: &Shape) -> Result<Option<Tensor>> {
        let _ = shape;
        self.read(key)
    }
    /// The codes of an FP8 (e4m3) tensor stored under `key` as their raw bytes, `U8` of the stored shape, when
    /// the source can give them so without converting them (a file source reads the bytes straight into the
    /// tensor's buffer); `None` when the tensor is not FP8, there is none, or the source cannot: the caller then
    /// reads it with [`TensorSource::read`].
    fn read_fp8_codes(&self, key: &str) -> Result<Option<Tensor>> {
        let _ = key;
        Ok(None)
    }
}

impl TensorSource for HashMap<String, Tensor> {
    fn contains(&self, key: &str) -> bool {
        self.contains_key(key)
    }

    fn read(&self, key: &str) -> Result<Option<Tensor>> {
        Ok(self.get(key).cloned())
    }
}

/// Named tensors plus the prefix of the module being built, the compute dtype, the device and whether linear
/// bases are quantised to FP8 on load.
#[derive(Clone)]
pub struct Vb {
    tensors: Arc<dyn TensorSource>,
    prefix: String,
    dtype: DType,
    device: Device,
    fp8: Option<Fp8Scale>,
    fp8_products: bool,
}

impl Vb {
    /// Wraps a map of tensors keyed by their full (official) names.
    pub fn from_tensors(tensors: HashMap<String, Tensor>, dtype: DType, device: &Device) -> Self {
        Self::from_source(Arc::new(tensors), dtype, device)
    }

    /// Wraps a source that reads each tensor when a module asks for it.
    pub fn from_source(source: Arc<dyn TensorSource>, dtype: DType, device: &Device) -> Self {
        Self {
            tensors: source,
            prefix: String::new(),
            dtype,
            device: device.clone(),
            fp8: None,
            fp8_products: false,
        }
    }

    /// The same view with tensors moved to `device` instead (block streaming builds streamed blocks in host RAM).
    pub fn with_device(&self, device: &Device) -> Self {
        Self {
            device: device.clone(),
            ..self.clone()
        }
    }

    /// The view of a sub-module: `vb.pp("blocks").pp(3)` reads `blocks.3.*`.
    pub fn pp<S: ToString>(&self, name: S) -> Self {
        Self {
            prefix: self.path(&name.to_string()),
            ..self.clone()
        }
    }

    /// The full key of `name` under this view's prefix.
    pub fn path(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    /// This view's prefix (the module path, e.g. `blocks.3.self_attn.q`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether `name` exists under this view's prefix.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains(&self.path(name))
    }

    /// The compute dtype tensors are converted to by [`Vb::get`].
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device tensors are moved to.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// A view with another compute dtype (e.g. f32 for modulation parameters).
    pub fn with_dtype(&self, dtype: DType) -> Self {
        Self {
            dtype,
            ..self.clone()
        }
    }

    /// A view whose `Linear`s quantise dense base weights to FP8 with these scales (`None`: keep them dense).
    /// Pre-quantised FP8 weights keep their own scales when this is set, and are dequantised when it is not.
    pub fn with_fp8(&self, fp8: Option<Fp8Scale>) -> Self {
        Self {
            fp8,
            ..self.clone()
        }
    }

    /// The FP8 mode set by [`Vb::with_fp8`].
    pub fn fp8(&self) -> Option<Fp8Scale> {
        self.fp8
    }

    /// A view whose FP8 `Linear`s multiply on FP8 tensor cores ([`crate::fp8::Fp8Weight::for_fp8_products`]);
    /// only FP8 bases (see [`Vb::with_fp8`]) are affected.
    pub fn with_fp8_products(&self, on: bool) -> Self {
        Self {
            fp8_products: on,
            ..self.clone()
        }
    }

    /// Whether [`Vb::with_fp8_products`] is on.
    pub fn fp8_products(&self) -> bool {
        self.fp8_products
    }

    /// The tensor exactly as the loader stored it: dtype and device unchanged (quantisation reads it on the
    /// host without a round trip through the accelerator).
    pub fn get_stored(&self, name: &str) -> Result<Tensor> {
        // Every tensor a model is built from is read here (or in `get`): a stop asked for while a model loads
        // ends the load at the next tensor.
        super::cancel::check_candle()?;
        let key = self.path(name);
        found(&key, timed(LoadPart::Reading, || self.tensors.read(&key))?)
    }

    /// The codes of the FP8 tensor `name` as `U8` bytes, on the host, when the source gives them without a
    /// conversion ([`TensorSource::read_fp8_codes`]); `None` otherwise (read it with [`Vb::get_stored`]).
    pub fn get_fp8_codes(&self, name: &str) -> Result<Option<Tensor>> {
        super::cancel::check_candle()?;
        let key = self.path(name);
        timed(LoadPart::Reading, || self.tensors.read_fp8_codes(&key))
    }

    /// The tensor as stored (dtype unchanged), moved to the device.
    pub fn get_raw(&self, name: &str) -> Result<Tensor> {
        let stored = self.get_stored(name)?;
        timed(LoadPart::ToDevice, || stored.to_device(&self.device))
    }

    /// The tensor with the expected shape, converted to the compute dtype. An FP8 `weight` stored with a scale
    /// beside it (ComfyUI `scaled_fp8` files scale embeddings and norms too, not only Linears) is dequantised
    /// with that scale: one per tensor, or one per row.
    pub fn get<S: Into<Shape>>(&self, shape: S, name: &str) -> Result<Tensor> {
        let shape = shape.into();
        super::cancel::check_candle()?;
        let key = self.path(name);
        let read = found(
            &key,
            timed(LoadPart::Reading, || self.tensors.read_shaped(&key, &shape))?,
        )?;
        let t = timed(LoadPart::ToDevice, || read.to_device(&self.device))?;
        if t.shape() != &shape {
            candle_core::bail!(
                "tensor `{key}` has shape {:?}, expected {:?}",
                t.dims(),
                shape.dims()
            );
        }
        if t.dtype() == DType::F8E4M3 && name == "weight" {
            if let Some(scale) = self.weight_scale()? {
                return timed(LoadPart::Fp8, || self.dequantize(&t, &scale));
            }
        }
        t.to_dtype(self.dtype)
    }

    /// The scale stored beside this module's FP8 `weight`, under whichever name the checkpoint uses.
    pub fn weight_scale(&self) -> Result<Option<Tensor>> {
        WEIGHT_SCALE_KEYS
            .into_iter()
            .find(|name| self.contains(name))
            .map(|name| self.get_stored(name))
            .transpose()
    }

    fn dequantize(&self, codes: &Tensor, scale: &Tensor) -> Result<Tensor> {
        let scale = scale.to_device(&self.device)?.to_dtype(DType::F32)?;
        let rows = codes.dims().first().copied().unwrap_or(1);
        let scale = match scale.elem_count() {
            1 => scale.flatten_all()?.reshape(())?,
            n if n == rows && codes.rank() >= 1 => {
                let mut dims = vec![1; codes.rank()];
                dims[0] = rows;
                scale.reshape(dims)?
            }
            n => candle_core::bail!(
                "`{}` has {n} scales for a weight of shape {:?}: expected one, or one per row",
                self.path("weight"),
                codes.dims()
            ),
        };
        codes
            .to_dtype(DType::F32)?
            .broadcast_mul(&scale)?
            .to_dtype(self.dtype)
    }
}

/// The tensor read under `key`, or the error naming the key that the checkpoint lacks.
fn found(key: &str, tensor: Option<Tensor>) -> Result<Tensor> {
    match tensor {
        Some(t) => Ok(t),
        None => candle_core::bail!("missing tensor `{key}` in the checkpoint"),
    }
}

/// A source that holds no tensors but makes each one a module asks for by shape ([`Vb::get`]), zero-filled in
/// the asked dtype on the CPU, and records its name and shape: building a model on it lists the tensors a
/// checkpoint of that model holds (e.g. to write one of random weights). Modules that read tensors without a
/// shape ([`Vb::get_stored`], [`Linear::load`](crate::linear::Linear::load)) or ask whether one exists find none.
#[derive(Debug, Default)]
pub struct ShapeRecorder {
    seen: std::sync::Mutex<Vec<(String, Vec<usize>)>>,
}

impl ShapeRecorder {
    /// The tensors asked for so far, in the order they were asked for.
    pub fn shapes(&self) -> Vec<(String, Vec<usize>)> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl TensorSource for ShapeRecorder {
    fn contains(&self, _key: &str) -> bool {
        false
    }

    fn read(&self, _key: &str) -> Result<Option<Tensor>> {
        Ok(None)
    }

    fn read_shaped(&self, key: &str, shape: &Shape) -> Result<Option<Tensor>> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((key.to_string(), shape.dims().to_vec()));
        Tensor::zeros(shape, DType::F32, &Device::Cpu).map(Some)
    }
}

/// Where FP8 checkpoints keep a weight's scale: `scale_weight` (ComfyUI `scaled_fp8`, musubi-tuner) or
/// `weight_scale` (ComfyUI mixed precision, other exporters).
pub const WEIGHT_SCALE_KEYS: [&str; 2] = ["scale_weight", "weight_scale"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_recorder_lists_what_modules_ask_for() -> Result<()> {
        let recorder = Arc::new(ShapeRecorder::default());
        let vb = Vb::from_source(recorder.clone(), DType::BF16, &Device::Cpu).pp("encoder");
        let w = vb.pp("conv1").get((4, 3, 3), "weight")?;
        assert_eq!((w.dims(), w.dtype()), (&[4, 3, 3][..], DType::BF16));
        vb.pp("norm").get(4, "gamma")?;
        assert!(!vb.contains("conv1.bias"));
        assert!(vb.get_stored("conv1.weight").is_err());
        assert_eq!(
            recorder.shapes(),
            [
                ("encoder.conv1.weight".to_string(), vec![4, 3, 3]),
                ("encoder.norm.gamma".to_string(), vec![4]),
            ]
        );
        Ok(())
    }
}
