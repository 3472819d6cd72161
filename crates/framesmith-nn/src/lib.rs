//! Neural-network building blocks shared by the models: linear layers (dense, FP8, LoRA), attention, norms and
//! the checkpoint tensor view. Knows nothing of channels, config files or logging.

pub mod adapter;
pub mod attention;
pub mod bytes;
pub mod cancel;
pub mod collective;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod driver;
pub mod file;
pub mod fp8;
pub mod init;
pub mod linear;
pub mod load_timing;
pub mod lora;
pub mod lora_file;
pub mod norm;
pub mod offload;
pub mod ops;
pub mod optim;
pub mod testing;
pub mod vb;
