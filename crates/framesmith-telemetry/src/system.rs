//! System RAM and this process's resident memory through sysinfo.

use sysinfo::{MemoryRefreshKind, Pid, ProcessRefreshKind, ProcessesToUpdate, System};

use super::history::Sample;

pub(super) struct SystemSource {
    /// `None` where sysinfo does not support the platform; RAM then reads as zero.
    system: Option<System>,
    pid: Option<Pid>,
}

impl SystemSource {
    pub(super) fn new() -> Self {
        Self {
            system: System::new().ok(),
            pid: sysinfo::get_current_pid().ok(),
        }
    }

    pub(super) fn sample(&mut self, sample: &mut Sample) {
        let Some(system) = &mut self.system else {
            return;
        };
        system.refresh_memory_specifics(MemoryRefreshKind::nothing().with_ram());
        sample.ram_total_bytes = system.total_memory();
        sample.ram_used_bytes = system.used_memory();
        if let Some(pid) = self.pid {
            system.refresh_processes_specifics(
                ProcessesToUpdate::Some(&[pid]),
                false,
                ProcessRefreshKind::nothing().with_memory(),
            );
            sample.process_resident_bytes = system.process(pid).map_or(0, |p| p.memory());
        }
    }
}
