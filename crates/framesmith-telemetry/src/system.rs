//! System RAM and the resident memory of the run's processes (the app and its rank processes) through sysinfo.

use sysinfo::{MemoryRefreshKind, Pid, ProcessRefreshKind, ProcessesToUpdate, System};

use super::history::Sample;

pub(super) struct SystemSource {
    /// `None` where sysinfo does not support the platform; RAM then reads as zero.
    system: Option<System>,
}

impl SystemSource {
    pub(super) fn new() -> Self {
        Self {
            system: System::new().ok(),
        }
    }

    /// Samples RAM; the resident memory of `pids` is summed into `process_resident_bytes`.
    pub(super) fn sample(&mut self, sample: &mut Sample, pids: &[u32]) {
        let Some(system) = &mut self.system else {
            return;
        };
        system.refresh_memory_specifics(MemoryRefreshKind::nothing().with_ram());
        sample.ram_total_bytes = system.total_memory();
        sample.ram_used_bytes = system.used_memory();
        let pids: Vec<Pid> = pids.iter().map(|&pid| Pid::from_u32(pid)).collect();
        // `true`: a rank process that ended is forgotten, not counted at its last size.
        system.refresh_processes_specifics(
            ProcessesToUpdate::Some(&pids),
            true,
            ProcessRefreshKind::nothing().with_memory(),
        );
        sample.process_resident_bytes = pids
            .iter()
            .filter_map(|pid| system.process(*pid))
            .map(|p| p.memory())
            .sum();
    }
}
