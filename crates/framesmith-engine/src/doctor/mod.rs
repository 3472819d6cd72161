//! The system check behind `framesmith doctor` and the app's "System check": reads this build and this machine
//! (`facts`, `host`) and says what stops or slows training and how to fix it (`findings`), as the plain data of
//! `framesmith_config::protocol::doctor`. May block for a moment (NVML, CUDA, `ffmpeg -version`): the app calls
//! it on a job thread.

mod facts;
mod findings;
mod host;

use std::path::Path;

use framesmith_config::protocol::doctor::SystemReport;

pub use findings::{findings, BLOCKING_FREE_DISK_BYTES, LOW_FREE_DISK_BYTES, LOW_RAM_BYTES};

/// Checks this build and machine for training into `output_dir` (which need not exist yet).
pub fn check(output_dir: &Path) -> SystemReport {
    let facts = facts::gather(output_dir);
    SystemReport {
        findings: findings(&facts),
        facts,
    }
}
