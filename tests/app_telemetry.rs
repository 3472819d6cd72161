//! One telemetry sample from the real sources: RAM always, GPUs when NVML finds any (else a reason that says so).
//! On a machine with NVIDIA GPUs this checks the NVML path end to end.

#[test]
fn one_sample_reads_ram_and_each_gpu_or_says_why_not() {
    let (sample, gpu_status) = framesmith_telemetry::sample_once();
    println!("{sample:#?}\nGPU status: {gpu_status:?}");
    assert!(sample.ram_total_bytes > 0);
    assert!(sample.ram_used_bytes <= sample.ram_total_bytes);
    assert!(
        sample.process_resident_bytes > 0,
        "sysinfo sees this process"
    );
    match gpu_status {
        Ok(()) => {
            assert!(!sample.gpus.is_empty());
            for gpu in &sample.gpus {
                assert!(gpu.memory_total_bytes > 0, "{gpu:?}");
                assert!(gpu.memory_used_bytes <= gpu.memory_total_bytes, "{gpu:?}");
                assert!(!gpu.name.is_empty());
            }
        }
        Err(reason) => {
            assert!(sample.gpus.is_empty());
            assert!(
                reason.contains("NVIDIA") || reason.contains("NVML"),
                "{reason}"
            );
        }
    }
}
