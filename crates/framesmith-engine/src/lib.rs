//! The engine: training (`train`), the demo model and project (`demo`) and the parity checks against the
//! official implementations (`parity`). Talks to the app only through `framesmith_config::protocol`.

pub mod demo;
pub mod parity;
pub mod train;
