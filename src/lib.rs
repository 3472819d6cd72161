//! The library half of the `framesmith` package: the GUI's backend, which `main.rs` opens the app with and the
//! app's integration tests in `tests/` drive the real modules through, and the LoRA tools' reports, which the
//! command line and that backend share.

#[cfg(feature = "gui")]
pub mod gui;
pub mod lora;
