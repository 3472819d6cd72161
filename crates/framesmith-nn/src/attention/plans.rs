//! cuDNN's attention plans kept on disk between runs. Building a fused-attention plan compiles its kernels, which
//! made the first training step of a run tens of seconds slower than the others; with a folder set, each plan built
//! is written there and a later run reads it back instead (files per GPU model, cuDNN and frontend version, so a
//! plan is never used where it was not built). Without the `cudnn` feature nothing is kept and the counts are
//! `None`.

use std::path::{Path, PathBuf};

/// What the plan cache did in this process so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlanCounts {
    /// Plans read back from the folder.
    pub read: u64,
    /// Plans built (and, unless counted in `unwritten`, written to the folder when one is set).
    pub built: u64,
    /// Plans built that could not be written (a read-only or full disk); the next run builds them again.
    pub unwritten: u64,
}

impl PlanCounts {
    /// "attention plans: 4 read from the disk cache, 2 built", or `None` when no plan was needed.
    pub fn describe(&self) -> Option<String> {
        if self.read + self.built == 0 {
            return None;
        }
        let mut text = format!(
            "attention plans: {} read from the disk cache, {} built",
            self.read, self.built
        );
        if self.unwritten > 0 {
            text.push_str(&format!(" ({} could not be kept)", self.unwritten));
        }
        Some(text)
    }
}

/// Keeps attention plans under `root` (one folder per GPU model beneath it), or no longer keeps them (`None`).
/// Takes effect for each GPU at its next attention call.
pub fn keep_plans_in(root: Option<&Path>) {
    #[cfg(feature = "cudnn")]
    crate::cuda::attention::set_plan_root(root.map(Path::to_path_buf));
    #[cfg(not(feature = "cudnn"))]
    let _ = root;
}

/// The plan cache's counts, `None` when this build has no cuDNN attention.
pub fn plan_counts() -> Option<PlanCounts> {
    #[cfg(feature = "cudnn")]
    return crate::cuda::attention::plan_counts();
    #[cfg(not(feature = "cudnn"))]
    None
}

/// The folder for one GPU model's plans under `root`: the model's name (letters and digits, the rest as `-`) and
/// its compute capability, e.g. `NVIDIA-H200-sm90`.
pub fn device_folder(root: &Path, name: &str, capability: (i32, i32)) -> PathBuf {
    let name: String = name
        .trim()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    root.join(format!("{name}-sm{}{}", capability.0, capability.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_gpu_model_gets_its_own_folder() {
        let root = Path::new("/c");
        assert_eq!(
            device_folder(root, "NVIDIA GeForce RTX 4090 ", (8, 9)),
            Path::new("/c/NVIDIA-GeForce-RTX-4090-sm89")
        );
        assert_ne!(
            device_folder(root, "NVIDIA H200", (9, 0)),
            device_folder(root, "NVIDIA H100 80GB HBM3", (9, 0))
        );
    }

    #[test]
    fn the_counts_name_what_was_read_and_built() {
        assert_eq!(PlanCounts::default().describe(), None);
        let counts = PlanCounts {
            read: 4,
            built: 2,
            unwritten: 1,
        };
        assert_eq!(
            counts.describe().as_deref(),
            Some("attention plans: 4 read from the disk cache, 2 built (1 could not be kept)")
        );
    }
}
