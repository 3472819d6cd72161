//! The system check in words: one section of lines per topic and the whole report as text, shared by the
//! terminal and the app.

use std::fmt;

use super::{
    AttentionPath, DiskFacts, DriverModel, MediaFacts, MemoryFacts, PageLockedLimit, Section,
    Severity, SystemFacts, SystemReport, ToolFacts, BUILD_CUDA, MIN_DRIVER_MAJOR,
};
use crate::protocol::memory::format_gib;

impl SystemReport {
    /// The facts in words, one section per topic, shared by the terminal and the app.
    pub fn sections(&self) -> Vec<Section> {
        vec![
            Section {
                title: "Build",
                lines: self.build_lines(),
            },
            Section {
                title: "GPU",
                lines: gpu_lines(&self.facts),
            },
            Section {
                title: "CUDA libraries",
                lines: library_lines(&self.facts),
            },
            Section {
                title: "Memory",
                lines: memory_lines(&self.facts.memory),
            },
            Section {
                title: "Video",
                lines: media_lines(&self.facts.media),
            },
            Section {
                title: "Disk",
                lines: disk_lines(&self.facts.disk),
            },
        ]
    }

    fn build_lines(&self) -> Vec<String> {
        let b = &self.facts.build;
        let cuda = match (b.cuda, b.cudnn) {
            (false, _) => "no CUDA: this build trains on the CPU only".to_owned(),
            (true, false) => format!("CUDA {BUILD_CUDA}, without cuDNN"),
            (true, true) => format!("CUDA {BUILD_CUDA}, with cuDNN"),
        };
        let attention = match self.attention() {
            AttentionPath::Fused(v) => format!("Attention: fused (cuDNN {v}) for bf16 on the GPU"),
            AttentionPath::Portable(why) => format!("Attention: portable tiled kernel ({why})"),
        };
        vec![
            format!("Framesmith {} for {}", b.version, b.platform),
            format!("GPU support: {cuda}"),
            attention,
        ]
    }
}

fn gpu_lines(facts: &SystemFacts) -> Vec<String> {
    let scan = &facts.gpus;
    let mut lines = Vec::new();
    match (&scan.driver, facts.build.reads_machine) {
        (Some(d), _) => {
            let cuda = d
                .cuda
                .map(|c| format!(", runs CUDA up to {c}"))
                .unwrap_or_default();
            lines.push(format!(
                "NVIDIA driver {}{cuda} (the GPU build needs {MIN_DRIVER_MAJOR} or newer)",
                d.version
            ));
        }
        (None, true) => lines.push(format!(
            "NVIDIA driver: not found (the GPU build needs {MIN_DRIVER_MAJOR} or newer)"
        )),
        // The error line below says why nothing was read.
        (None, false) => {}
    }
    if let Some(err) = &scan.error {
        lines.push(format!("GPUs not read: {err}"));
    } else if scan.gpus.is_empty() {
        lines.push("No NVIDIA GPU".into());
    }
    for gpu in &scan.gpus {
        let cc = gpu
            .compute_capability
            .map_or("compute capability unknown".into(), |c| {
                format!("compute capability {c}")
            });
        let mut line = format!(
            "GPU {} · {} · {cc} · {} free of {}",
            gpu.index,
            gpu.name,
            format_gib(gpu.memory_free_bytes),
            format_gib(gpu.memory_total_bytes)
        );
        match gpu.driver_model {
            Some(DriverModel::Wddm) => line += " · WDDM",
            Some(DriverModel::Tcc) => line += " · TCC",
            None => {}
        }
        lines.push(line);
    }
    if let Some(cuda) = &facts.cuda {
        match (cuda.device_count, &cuda.device_error) {
            (_, Some(err)) => lines.push(format!("CUDA cannot use the GPUs: {err}")),
            (Some(n), None) => lines.push(format!("CUDA devices: {n}")),
            (None, None) => {}
        }
    }
    if facts.build.is_windows() {
        lines.push(
            "Sysmem fallback: cannot be read here; NVIDIA Control Panel > Manage 3D settings > CUDA - Sysmem \
             Fallback Policy shows it (Prefer No Sysmem Fallback: out of memory instead of a slow spill)"
                .into(),
        );
    }
    lines
}

fn library_lines(facts: &SystemFacts) -> Vec<String> {
    let Some(cuda) = &facts.cuda else {
        return vec!["None: this build has no CUDA".into()];
    };
    cuda.libraries
        .iter()
        .chain(&cuda.cudnn)
        .map(|lib| {
            let mut line = match (&lib.version, &lib.error) {
                (_, Some(err)) => format!("{}: {err}", lib.name),
                (Some(v), None) => format!("{} {v}", lib.name),
                (None, None) => format!("{}: version unknown", lib.name),
            };
            if let Some(path) = &lib.path {
                line += &format!(" · {}", path.display());
            }
            line
        })
        .collect()
}

fn memory_lines(m: &MemoryFacts) -> Vec<String> {
    let ram = match (m.ram_total_bytes, m.ram_available_bytes) {
        (Some(total), Some(free)) => {
            format!("RAM {}, {} available", format_gib(total), format_gib(free))
        }
        (Some(total), None) => format!("RAM {}", format_gib(total)),
        _ => "RAM: not read in this build".into(),
    };
    let pinned = match m.page_locked {
        PageLockedLimit::Unlimited => "Page-locked memory: unlimited (ulimit -l)".to_owned(),
        // The NVIDIA driver pins without charging RLIMIT_MEMLOCK: cudaHostAlloc and cudaHostRegister of GiBs
        // succeed under a 64 KiB limit for a user without CAP_IPC_LOCK. The limit bounds mlock and RDMA only.
        PageLockedLimit::Rlimit(bytes) => format!(
            "Page-locked memory: ulimit -l {} (it does not limit CUDA's pinned buffers)",
            format_gib(bytes)
        ),
        PageLockedLimit::HalfOfRam(bytes) => format!(
            "Page-locked memory: about {} (Windows allows about half of RAM, shown as shared GPU memory)",
            format_gib(bytes)
        ),
        PageLockedLimit::Unknown => "Page-locked memory: limit not known here".to_owned(),
    };
    vec![ram, pinned]
}

fn tool_line(name: &str, tool: Option<&ToolFacts>, missing: &str) -> String {
    match tool {
        None => format!("{name}: {missing}"),
        Some(t) => match &t.version {
            Ok(v) => format!("{name}: {v} · {}", t.path.display()),
            Err(err) => format!("{name}: {err} · {}", t.path.display()),
        },
    }
}

fn media_lines(m: &MediaFacts) -> Vec<String> {
    let missing = if m.media_foundation {
        "not found (Windows Media Foundation reads the videos)"
    } else {
        "not found"
    };
    vec![
        tool_line("ffmpeg", m.ffmpeg.as_ref(), missing),
        tool_line("ffprobe", m.ffprobe.as_ref(), missing),
    ]
}

fn disk_lines(d: &DiskFacts) -> Vec<String> {
    let folder = d.folder.display();
    let line = match (d.free_bytes, &d.error) {
        (Some(free), _) => {
            let total = d
                .total_bytes
                .map(|t| format!(" of {}", format_gib(t)))
                .unwrap_or_default();
            let mount = d
                .mount_point
                .as_ref()
                .map(|m| format!(" (disk at {})", m.display()))
                .unwrap_or_default();
            format!(
                "{} free{total} for the output folder{mount}: {folder}",
                format_gib(free)
            )
        }
        (None, Some(err)) => format!("Free space unknown ({err}): {folder}"),
        (None, None) => format!("Free space unknown: {folder}"),
    };
    vec![line]
}

impl fmt::Display for SystemReport {
    /// The sections, then every problem with its fix, then the verdict.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for section in self.sections() {
            writeln!(f, "{}", section.title)?;
            for line in &section.lines {
                writeln!(f, "  {line}")?;
            }
        }
        if !self.findings.is_empty() {
            writeln!(f, "Problems")?;
        }
        for finding in &self.findings {
            let mark = match finding.severity {
                Severity::Blocking => "blocks training",
                Severity::Warning => "warning",
            };
            writeln!(f, "  {mark}: {}", finding.problem)?;
            writeln!(f, "    fix: {}", finding.fix)?;
        }
        writeln!(f, "{}", self.verdict_line())
    }
}
