use std::path::PathBuf;

use framesmith_config::protocol::doctor::{
    BuildFacts, ComputeCapability, CudaFacts, CudaVersion, DiskFacts, DriverFacts, Finding,
    GpuFacts, GpuScan, LibraryFacts, MediaFacts, MemoryFacts, PageLockedLimit, Severity,
    SystemFacts, ToolFacts,
};

use super::*;

fn gpu(index: u32, name: &str, cc: (u32, u32)) -> GpuFacts {
    GpuFacts {
        index,
        name: name.into(),
        compute_capability: Some(ComputeCapability {
            major: cc.0,
            minor: cc.1,
        }),
        memory_total_bytes: 24 * GIB,
        memory_free_bytes: 23 * GIB,
        driver_model: None,
    }
}

fn library(name: &str, version: &str) -> LibraryFacts {
    LibraryFacts {
        name: name.into(),
        version: Some(version.into()),
        path: None,
        error: None,
    }
}

fn tool(path: &str) -> Option<ToolFacts> {
    Some(ToolFacts {
        path: PathBuf::from(path),
        version: Ok("ffmpeg version 6.1.1".into()),
    })
}

/// A Linux GPU build (cuDNN) on an RTX 4090 with everything in order.
fn healthy() -> SystemFacts {
    SystemFacts {
        build: BuildFacts {
            version: "0.1.0".into(),
            platform: "linux x86_64".into(),
            cuda: true,
            cudnn: true,
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
            gpus: vec![gpu(0, "NVIDIA GeForce RTX 4090", (8, 9))],
            error: None,
        },
        cuda: Some(CudaFacts {
            device_count: Some(1),
            device_error: None,
            libraries: vec![library("CUDA driver", "13.0"), library("cuBLAS", "13.0.0")],
            cudnn: Some(library("cuDNN", "9.19.0")),
        }),
        memory: MemoryFacts {
            ram_total_bytes: Some(64 * GIB),
            ram_available_bytes: Some(60 * GIB),
            page_locked: PageLockedLimit::Unlimited,
        },
        media: MediaFacts {
            ffmpeg: tool("/usr/bin/ffmpeg"),
            ffprobe: tool("/usr/bin/ffprobe"),
            media_foundation: false,
        },
        disk: DiskFacts {
            folder: PathBuf::from("/data/output"),
            mount_point: Some(PathBuf::from("/data")),
            free_bytes: Some(200 * GIB),
            total_bytes: Some(1000 * GIB),
            error: None,
        },
    }
}

fn cpu_build(mut facts: SystemFacts) -> SystemFacts {
    facts.build.cuda = false;
    facts.build.cudnn = false;
    facts.cuda = None;
    facts
}

/// The one finding `facts` gives.
fn only(facts: &SystemFacts) -> Finding {
    let found = findings(facts);
    assert_eq!(found.len(), 1, "{found:#?}");
    found.into_iter().next().unwrap()
}

#[test]
fn a_healthy_gpu_machine_has_nothing_to_fix() {
    assert_eq!(findings(&healthy()), vec![]);
}

#[test]
fn the_cpu_build_says_so_plainly_and_how_to_get_the_gpu_build() {
    let f = only(&cpu_build(healthy()));
    assert_eq!(f.severity, Severity::Warning);
    assert!(
        f.problem
            .starts_with("This build has no CUDA: training runs on the CPU")
            && f.problem.contains("NVIDIA GeForce RTX 4090"),
        "{f:?}"
    );
    assert!(
        f.fix.contains("cargo build --release --features cudnn"),
        "{f:?}"
    );

    let mut windows = cpu_build(healthy());
    windows.build.platform = "windows x86_64".into();
    windows.media.media_foundation = true;
    assert!(only(&windows)
        .fix
        .contains("Framesmith-Setup-0.1.0-cuda.exe"));

    // No GPU and no driver: the CPU build's one warning says it all.
    let mut bare = cpu_build(healthy());
    bare.gpus = GpuScan {
        error: Some("no NVIDIA driver found (NVML: libnvidia-ml.so.1: cannot open)".into()),
        ..GpuScan::default()
    };
    let f = only(&bare);
    assert!(!f.problem.contains("although"), "{f:?}");
}

#[test]
fn a_gpu_build_without_a_gpu_falls_back_to_the_cpu_with_a_warning() {
    let mut facts = healthy();
    facts.gpus = GpuScan {
        error: Some("no NVIDIA driver found".into()),
        ..GpuScan::default()
    };
    let cuda = facts.cuda.as_mut().unwrap();
    cuda.device_count = None;
    cuda.device_error = Some("cuInit failed: CUDA_ERROR_NO_DEVICE".into());
    let f = only(&facts);
    assert_eq!(f.severity, Severity::Warning);
    assert_eq!(
        f.problem,
        "No NVIDIA driver found: training runs on the CPU"
    );
    assert!(f.fix.contains("580 or newer"), "{f:?}");
}

#[test]
fn an_old_driver_blocks_the_gpu_build_and_warns_the_cpu_build() {
    let mut facts = healthy();
    facts.gpus.driver = Some(DriverFacts {
        version: "570.86.10".into(),
        cuda: Some(CudaVersion {
            major: 12,
            minor: 8,
        }),
    });
    let f = only(&facts);
    assert_eq!(f.severity, Severity::Blocking);
    assert_eq!(
        f.problem,
        "NVIDIA driver 570.86.10 runs CUDA up to 12.8; the GPU build needs CUDA 13.0, driver 580 or newer"
    );
    assert!(
        f.fix.starts_with("update the NVIDIA driver to 580"),
        "{f:?}"
    );

    let found = findings(&cpu_build(facts.clone()));
    assert!(
        found.iter().all(|f| f.severity == Severity::Warning),
        "{found:#?}"
    );
    assert!(found.iter().any(|f| f.problem.contains("570.86.10")));

    // Without NVML's CUDA version, the branch decides.
    facts.gpus.driver = Some(DriverFacts {
        version: "575.51".into(),
        cuda: None,
    });
    assert!(only(&facts).problem.contains("575.51 is too old"));
}

#[test]
fn a_card_below_compute_capability_8_is_named() {
    let mut facts = healthy();
    facts.gpus.gpus = vec![gpu(0, "NVIDIA GeForce RTX 2080 Ti", (7, 5))];
    let f = only(&facts);
    assert_eq!(f.severity, Severity::Blocking);
    assert_eq!(
        f.problem,
        "GPU 0 (NVIDIA GeForce RTX 2080 Ti) has compute capability 7.5; Framesmith's GPU kernels need 8.0 or newer"
    );
    assert!(f.fix.contains("training.device = \"cpu\""), "{f:?}");

    // With a usable card beside it, the old one is a warning that points at the good one.
    facts
        .gpus
        .gpus
        .push(gpu(1, "NVIDIA GeForce RTX 3090", (8, 6)));
    let f = only(&facts);
    assert_eq!(f.severity, Severity::Warning);
    assert_eq!(
        f.fix,
        "train on GPU 1 (NVIDIA GeForce RTX 3090): training.device = \"cuda:1\""
    );
}

#[test]
fn cuda_that_cannot_open_listed_gpus_blocks() {
    let mut facts = healthy();
    let cuda = facts.cuda.as_mut().unwrap();
    cuda.device_count = None;
    cuda.device_error = Some("cuInit failed: CUDA_ERROR_SYSTEM_DRIVER_MISMATCH".into());
    let f = only(&facts);
    assert_eq!(f.severity, Severity::Blocking);
    assert!(
        f.problem.contains("CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"),
        "{f:?}"
    );

    let mut hidden = healthy();
    hidden.cuda.as_mut().unwrap().device_count = Some(0);
    let f = only(&hidden);
    assert_eq!(f.severity, Severity::Blocking);
    assert!(f.fix.contains("CUDA_VISIBLE_DEVICES"), "{f:?}");
}

#[test]
fn a_missing_cudnn_blocks_only_where_attention_would_use_it() {
    let mut facts = healthy();
    let cuda = facts.cuda.as_mut().unwrap();
    cuda.cudnn = Some(LibraryFacts {
        name: "cuDNN".into(),
        version: None,
        path: None,
        error: Some("cannot open libcudnn.so.9: No such file or directory".into()),
    });
    let f = only(&facts);
    assert_eq!(f.severity, Severity::Blocking);
    assert!(f.problem.contains("cannot open libcudnn.so.9"), "{f:?}");
    assert!(f.fix.contains("nvidia-cudnn-cu13"), "{f:?}");

    // No CUDA device: training runs on the CPU, where cuDNN plays no part.
    facts.gpus.gpus.clear();
    facts.cuda.as_mut().unwrap().device_count = Some(0);
    let found = findings(&facts);
    assert!(
        found.iter().all(|f| !f.problem.contains("cuDNN")),
        "{found:#?}"
    );
}

#[test]
fn a_library_that_does_not_answer_is_a_warning() {
    let mut facts = healthy();
    facts.cuda.as_mut().unwrap().libraries[1] = LibraryFacts {
        name: "cuBLAS".into(),
        version: None,
        path: None,
        error: Some("cublasGetProperty failed: CUBLAS_STATUS_NOT_INITIALIZED".into()),
    };
    let f = only(&facts);
    assert_eq!(f.severity, Severity::Warning);
    assert!(f.problem.starts_with("cuBLAS does not answer"), "{f:?}");
}

#[test]
fn vram_held_by_other_programs_is_a_warning_in_the_gpu_build() {
    let mut facts = healthy();
    facts.gpus.gpus[0].memory_free_bytes = 10 * GIB;
    let f = only(&facts);
    assert_eq!(
        f.problem,
        "GPU 0 (NVIDIA GeForce RTX 4090) has only 10.00 GiB free of 24.00 GiB: other programs hold the rest"
    );
    // The CPU build trains in RAM: only its own warning.
    assert!(only(&cpu_build(facts))
        .problem
        .starts_with("This build has no CUDA"));
}

#[test]
fn little_ram_is_a_warning() {
    let mut facts = healthy();
    facts.memory.ram_total_bytes = Some(16 * GIB);
    let f = only(&facts);
    assert_eq!(f.severity, Severity::Warning);
    assert!(f.problem.starts_with("16.00 GiB of RAM"), "{f:?}");
}

#[test]
fn missing_ffmpeg_warns_where_nothing_else_reads_videos() {
    let mut facts = healthy();
    facts.media.ffmpeg = None;
    let f = only(&facts);
    assert_eq!(f.severity, Severity::Warning);
    assert!(f.problem.starts_with("ffmpeg was not found"), "{f:?}");
    assert!(f.fix.starts_with("install ffmpeg"), "{f:?}");

    facts.media.ffprobe = None;
    facts.media.media_foundation = true;
    assert_eq!(findings(&facts), vec![], "Media Foundation reads them");

    let mut broken = healthy();
    broken.media.ffprobe = Some(ToolFacts {
        path: PathBuf::from("/opt/ffprobe"),
        version: Err("ffprobe -version did not answer within 30 s".into()),
    });
    let f = only(&broken);
    assert!(f.problem.contains("/opt/ffprobe"), "{f:?}");
}

#[test]
fn a_nearly_full_disk_blocks_and_a_low_one_warns() {
    let mut facts = healthy();
    facts.disk.free_bytes = Some(512 << 20);
    let f = only(&facts);
    assert_eq!(f.severity, Severity::Blocking);
    assert!(
        f.problem
            .starts_with("Only 512.0 MiB free for the output folder")
            && f.problem.ends_with("/data/output"),
        "{f:?}"
    );
    facts.disk.free_bytes = Some(5 * GIB);
    assert_eq!(only(&facts).severity, Severity::Warning);
    facts.disk.free_bytes = None;
    facts.disk.error = Some("no disk holds this folder".into());
    assert_eq!(findings(&facts), vec![]);
}

#[test]
fn blocking_problems_come_first() {
    let mut facts = healthy();
    facts.memory.ram_total_bytes = Some(16 * GIB);
    facts.disk.free_bytes = Some(1 << 20);
    let found = findings(&facts);
    let severities: Vec<Severity> = found.iter().map(|f| f.severity).collect();
    assert_eq!(severities, vec![Severity::Blocking, Severity::Warning]);
}

#[test]
fn a_build_that_reads_nothing_says_so() {
    let mut facts = cpu_build(healthy());
    facts.build.reads_machine = false;
    facts.gpus = GpuScan {
        error: Some("this build does not read the GPUs".into()),
        ..GpuScan::default()
    };
    facts.memory.ram_total_bytes = None;
    let found = findings(&facts);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(found[1].problem.contains("telemetry"), "{found:#?}");
}
