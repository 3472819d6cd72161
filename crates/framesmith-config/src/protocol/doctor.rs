//! The system check (`framesmith doctor`, and the app's "System check" on the Monitor tab): what this build and
//! this machine offer for training — GPUs, driver, CUDA libraries, attention path, memory, ffmpeg, disk — and
//! each problem with its fix. Plain, serialisable data: the engine gathers the facts and words the findings
//! (`framesmith_engine::doctor`); the command line prints [`SystemReport`] and the app draws the same lines.

mod text;

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The oldest NVIDIA driver branch the GPU build runs on (CUDA 13.0 needs R580).
pub const MIN_DRIVER_MAJOR: u32 = 580;
/// The CUDA version the GPU build is compiled with: the driver must run at least this.
pub const BUILD_CUDA: CudaVersion = CudaVersion {
    major: 13,
    minor: 0,
};
/// Framesmith's kernels are PTX for compute capability 8.0 and 9.0: older cards cannot load them.
pub const MIN_COMPUTE_CAPABILITY: ComputeCapability = ComputeCapability { major: 8, minor: 0 };

/// A CUDA version (`13.0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CudaVersion {
    pub major: u32,
    pub minor: u32,
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// A GPU's compute capability (`8.6` for an RTX 3090).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ComputeCapability {
    pub major: u32,
    pub minor: u32,
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// What this binary was built with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildFacts {
    /// Framesmith's version.
    pub version: String,
    /// Operating system and processor (`linux x86_64`).
    pub platform: String,
    /// Built with the `cuda` feature (the GPU build).
    pub cuda: bool,
    /// Built with the `cudnn` feature (cuDNN's fused attention).
    pub cudnn: bool,
    /// Built with the `telemetry` feature: the GPUs (NVML), RAM and disks are read.
    pub reads_machine: bool,
}

impl BuildFacts {
    pub fn is_windows(&self) -> bool {
        self.platform.starts_with("windows")
    }
}

/// How Windows drives a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DriverModel {
    /// A display device: VRAM overflow spills into shared GPU memory (system RAM) unless sysmem fallback is off.
    Wddm,
    /// A compute device (Tesla Compute Cluster): no display, no spilling.
    Tcc,
}

/// One NVIDIA GPU, as NVML sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFacts {
    /// NVML's index (the CUDA index too, unless `CUDA_VISIBLE_DEVICES` reorders them).
    pub index: u32,
    pub name: String,
    pub compute_capability: Option<ComputeCapability>,
    pub memory_total_bytes: u64,
    pub memory_free_bytes: u64,
    /// Windows only.
    pub driver_model: Option<DriverModel>,
}

/// The NVIDIA driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverFacts {
    /// As NVIDIA writes it (`580.65.06`).
    pub version: String,
    /// The newest CUDA version this driver runs.
    pub cuda: Option<CudaVersion>,
}

impl DriverFacts {
    /// The driver branch (`580` of `580.65.06`).
    pub fn major(&self) -> Option<u32> {
        self.version.split('.').next()?.trim().parse().ok()
    }
}

/// What NVML said: the driver and every GPU, or why it could not be asked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuScan {
    pub driver: Option<DriverFacts>,
    pub gpus: Vec<GpuFacts>,
    /// Why the GPUs could not be read (no NVIDIA driver, a build that does not read them).
    pub error: Option<String>,
}

/// A library the GPU build uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LibraryFacts {
    /// `cuBLAS`.
    pub name: String,
    pub version: Option<String>,
    /// The file it was loaded from, where that can be read.
    pub path: Option<PathBuf>,
    /// Why it could not be loaded or asked for its version.
    pub error: Option<String>,
}

/// The CUDA side of a GPU build.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaFacts {
    /// CUDA devices the driver reports.
    pub device_count: Option<usize>,
    /// Why CUDA could not count its devices.
    pub device_error: Option<String>,
    /// The libraries linked in (the driver API, cuBLAS, cuBLASLt, cuRAND, NVRTC).
    pub libraries: Vec<LibraryFacts>,
    /// cuDNN, in a build with the `cudnn` feature (loaded at run time).
    pub cudnn: Option<LibraryFacts>,
}

/// How much host memory may be page-locked (block streaming's pinned buffers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "bytes", rename_all = "snake_case")]
pub enum PageLockedLimit {
    /// Linux `ulimit -l unlimited`.
    Unlimited,
    /// Linux `ulimit -l` (RLIMIT_MEMLOCK): shown for completeness, as CUDA's page-locked buffers are not
    /// charged to it.
    Rlimit(u64),
    /// Windows: about half of RAM, shown as shared GPU memory.
    HalfOfRam(u64),
    /// Not read on this system.
    Unknown,
}

/// RAM and the page-locked limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryFacts {
    pub ram_total_bytes: Option<u64>,
    pub ram_available_bytes: Option<u64>,
    pub page_locked: PageLockedLimit,
}

/// An external program and what it says its version is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolFacts {
    pub path: PathBuf,
    /// The first line of `-version`, or why it could not be run.
    pub version: Result<String, String>,
}

/// How videos are read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MediaFacts {
    pub ffmpeg: Option<ToolFacts>,
    pub ffprobe: Option<ToolFacts>,
    /// Windows' Media Foundation reads videos when ffmpeg is not installed.
    pub media_foundation: bool,
}

/// The disk that holds the output folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskFacts {
    /// The output folder asked about.
    pub folder: PathBuf,
    /// Where the disk holding it is mounted.
    pub mount_point: Option<PathBuf>,
    pub free_bytes: Option<u64>,
    pub total_bytes: Option<u64>,
    /// Why the free space is unknown.
    pub error: Option<String>,
}

/// Everything the check read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SystemFacts {
    pub build: BuildFacts,
    pub gpus: GpuScan,
    /// `None` in a build without CUDA.
    pub cuda: Option<CudaFacts>,
    pub memory: MemoryFacts,
    pub media: MediaFacts,
    pub disk: DiskFacts,
}

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Training cannot run as the user expects until this is fixed.
    Blocking,
    /// Training runs, slower or with less than it could.
    Warning,
}

/// One problem and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub severity: Severity,
    pub problem: String,
    pub fix: String,
}

/// How attention runs in training.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttentionPath {
    /// cuDNN's fused kernels (bf16 on the GPU), with cuDNN's version.
    Fused(String),
    /// Framesmith's portable tiled kernel, and why.
    Portable(String),
}

/// The facts and the findings: what `framesmith doctor` prints and the app shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SystemReport {
    pub facts: SystemFacts,
    /// Blocking problems first.
    pub findings: Vec<Finding>,
}

/// A titled group of lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    pub title: &'static str,
    pub lines: Vec<String>,
}

impl SystemReport {
    /// Whether anything stops training.
    pub fn blocks_training(&self) -> bool {
        self.findings
            .iter()
            .any(|f| f.severity == Severity::Blocking)
    }

    /// One line: nothing blocks training, or how many problems do.
    pub fn verdict_line(&self) -> String {
        let count = |severity| {
            self.findings
                .iter()
                .filter(|f| f.severity == severity)
                .count()
        };
        let (blocking, warnings) = (count(Severity::Blocking), count(Severity::Warning));
        let warned = match warnings {
            0 => String::new(),
            1 => " (1 warning)".into(),
            n => format!(" ({n} warnings)"),
        };
        match blocking {
            0 => format!("Nothing blocks training{warned}"),
            1 => format!("1 problem blocks training{warned}"),
            n => format!("{n} problems block training{warned}"),
        }
    }

    /// Fused or portable attention, and why.
    pub fn attention(&self) -> AttentionPath {
        let facts = &self.facts;
        let Some(cuda) = &facts.cuda else {
            return AttentionPath::Portable("this build has no CUDA".into());
        };
        if !facts.build.cudnn {
            return AttentionPath::Portable("this build has no cuDNN".into());
        }
        if cuda.device_count.unwrap_or(0) == 0 {
            return AttentionPath::Portable("no CUDA device".into());
        }
        match &cuda.cudnn {
            Some(LibraryFacts {
                version: Some(v),
                error: None,
                ..
            }) => AttentionPath::Fused(v.clone()),
            _ => AttentionPath::Portable("cuDNN cannot be loaded".into()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn report(cuda: Option<CudaFacts>, cudnn: bool) -> SystemReport {
        SystemReport {
            facts: SystemFacts {
                build: BuildFacts {
                    version: "0.1.0".into(),
                    platform: "linux x86_64".into(),
                    cuda: cuda.is_some(),
                    cudnn,
                    reads_machine: true,
                },
                gpus: GpuScan {
                    driver: Some(DriverFacts {
                        version: "580.65.06".into(),
                        cuda: Some(CudaVersion {
                            major: 13,
                            minor: 0,
                        }),
                    }),
                    gpus: vec![GpuFacts {
                        index: 0,
                        name: "NVIDIA GeForce RTX 4090".into(),
                        compute_capability: Some(ComputeCapability { major: 8, minor: 9 }),
                        memory_total_bytes: 24 * GIB,
                        memory_free_bytes: 22 * GIB,
                        driver_model: None,
                    }],
                    error: None,
                },
                cuda,
                memory: MemoryFacts {
                    ram_total_bytes: Some(64 * GIB),
                    ram_available_bytes: Some(60 * GIB),
                    page_locked: PageLockedLimit::Unlimited,
                },
                media: MediaFacts {
                    ffmpeg: None,
                    ffprobe: None,
                    media_foundation: false,
                },
                disk: DiskFacts {
                    folder: PathBuf::from("/runs/out"),
                    mount_point: Some(PathBuf::from("/runs")),
                    free_bytes: Some(100 * GIB),
                    total_bytes: Some(500 * GIB),
                    error: None,
                },
            },
            findings: Vec::new(),
        }
    }

    fn cudnn(version: Option<&str>, error: Option<&str>) -> CudaFacts {
        CudaFacts {
            device_count: Some(1),
            device_error: None,
            libraries: vec![LibraryFacts {
                name: "cuBLAS".into(),
                version: Some("13.0.0".into()),
                path: Some(PathBuf::from("/venv/libcublas.so.13")),
                error: None,
            }],
            cudnn: Some(LibraryFacts {
                name: "cuDNN".into(),
                version: version.map(Into::into),
                path: None,
                error: error.map(Into::into),
            }),
        }
    }

    fn warning(problem: &str) -> Finding {
        Finding {
            severity: Severity::Warning,
            problem: problem.into(),
            fix: "do this".into(),
        }
    }

    #[test]
    fn attention_is_fused_only_with_a_loaded_cudnn_and_a_device() {
        assert_eq!(
            report(None, false).attention(),
            AttentionPath::Portable("this build has no CUDA".into())
        );
        assert_eq!(
            report(Some(cudnn(Some("9.19.0"), None)), false).attention(),
            AttentionPath::Portable("this build has no cuDNN".into())
        );
        assert_eq!(
            report(Some(cudnn(Some("9.19.0"), None)), true).attention(),
            AttentionPath::Fused("9.19.0".into())
        );
        assert_eq!(
            report(Some(cudnn(None, Some("cannot open libcudnn.so.9"))), true).attention(),
            AttentionPath::Portable("cuDNN cannot be loaded".into())
        );
        let mut no_device = cudnn(Some("9.19.0"), None);
        no_device.device_count = Some(0);
        assert_eq!(
            report(Some(no_device), true).attention(),
            AttentionPath::Portable("no CUDA device".into())
        );
    }

    #[test]
    fn the_text_names_every_section_the_facts_and_the_fixes() {
        let mut r = report(Some(cudnn(Some("9.19.0"), None)), true);
        r.findings = vec![
            Finding {
                severity: Severity::Blocking,
                problem: "the driver is too old".into(),
                fix: "update it".into(),
            },
            warning("ffmpeg is missing"),
        ];
        let text = r.to_string();
        for expected in [
            "Build\n",
            "GPU support: CUDA 13.0, with cuDNN",
            "Attention: fused (cuDNN 9.19.0) for bf16 on the GPU",
            "NVIDIA driver 580.65.06, runs CUDA up to 13.0 (the GPU build needs 580 or newer)",
            "GPU 0 · NVIDIA GeForce RTX 4090 · compute capability 8.9 · 22.00 GiB free of 24.00 GiB",
            "CUDA devices: 1",
            "cuBLAS 13.0.0 · /venv/libcublas.so.13",
            "cuDNN 9.19.0",
            "RAM 64.00 GiB, 60.00 GiB available",
            "Page-locked memory: unlimited (ulimit -l)",
            "ffmpeg: not found",
            "100.00 GiB free of 500.00 GiB for the output folder (disk at /runs): /runs/out",
            "  blocks training: the driver is too old\n    fix: update it",
            "  warning: ffmpeg is missing\n    fix: do this",
            "1 problem blocks training (1 warning)",
        ] {
            assert!(text.contains(expected), "{expected:?} missing from\n{text}");
        }
        assert!(r.blocks_training());
        assert!(!text.contains("Sysmem fallback"), "Windows only:\n{text}");
    }

    #[test]
    fn a_cpu_build_says_so_and_lists_no_libraries() {
        let mut r = report(None, false);
        r.facts.build.platform = "windows x86_64".into();
        r.facts.media.media_foundation = true;
        r.facts.memory.page_locked = PageLockedLimit::HalfOfRam(32 * GIB);
        r.facts.gpus.gpus[0].driver_model = Some(DriverModel::Wddm);
        r.findings = vec![warning("no CUDA"), warning("no ffmpeg")];
        let text = r.to_string();
        for expected in [
            "GPU support: no CUDA: this build trains on the CPU only",
            "Attention: portable tiled kernel (this build has no CUDA)",
            "None: this build has no CUDA",
            "· WDDM",
            "Sysmem fallback: cannot be read here",
            "about 32.00 GiB (Windows allows about half of RAM",
            "ffmpeg: not found (Windows Media Foundation reads the videos)",
            "Nothing blocks training (2 warnings)",
        ] {
            assert!(text.contains(expected), "{expected:?} missing from\n{text}");
        }
        assert!(!r.blocks_training());
        assert!(!text.contains("CUDA devices"), "{text}");
    }

    #[test]
    fn the_report_survives_json() {
        let mut r = report(Some(cudnn(Some("9.19.0"), None)), true);
        r.facts.media.ffmpeg = Some(ToolFacts {
            path: PathBuf::from("/usr/bin/ffmpeg"),
            version: Err("did not answer within 30 s".into()),
        });
        r.facts.memory.page_locked = PageLockedLimit::Rlimit(8 << 20);
        r.findings = vec![warning("x")];
        assert!(r.to_string().contains(
            "Page-locked memory: ulimit -l 8.0 MiB (it does not limit CUDA's pinned buffers)"
        ));
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<SystemReport>(&json).unwrap(), r);
        assert!(
            json.contains(r#""page_locked":{"kind":"rlimit","bytes":8388608}"#),
            "{json}"
        );
    }

    #[test]
    fn the_driver_branch_is_read_from_its_version() {
        let driver = |v: &str| DriverFacts {
            version: v.into(),
            cuda: None,
        };
        assert_eq!(driver("580.65.06").major(), Some(580));
        assert_eq!(driver("572.16").major(), Some(572));
        assert_eq!(driver("unknown").major(), None);
    }
}
