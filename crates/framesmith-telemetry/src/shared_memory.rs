//! Windows shared GPU memory from the PDH counters `\GPU Adapter Memory(*)\Shared Usage` and
//! `\GPU Process Memory(*)\Shared Usage`. Under WDDM this is where VRAM overflow goes, and NVML cannot see it.
// PDH is a C API with no safe wrapper in the well-kept crates; every call is confined to this file, checks its
// status code, and reads buffers only within the sizes PDH reports.
#![allow(unsafe_code)]

use windows_sys::Win32::System::Performance::{
    PdhAddEnglishCounterW, PdhCloseQuery, PdhCollectQueryData, PdhGetFormattedCounterArrayW,
    PdhOpenQueryW, PDH_FMT_COUNTERVALUE_ITEM_W, PDH_FMT_LARGE, PDH_HCOUNTER, PDH_HQUERY,
    PDH_MORE_DATA,
};

use super::history::{Sample, SharedMemorySample};

const ADAPTER_COUNTER: &str = "\\GPU Adapter Memory(*)\\Shared Usage";
const PROCESS_COUNTER: &str = "\\GPU Process Memory(*)\\Shared Usage";
/// PDH_CSTATUS_VALID_DATA and PDH_CSTATUS_NEW_DATA.
const VALID_STATUSES: [u32; 2] = [0, 1];

pub(super) struct SharedMemorySource {
    query: Result<Query, String>,
    /// Process instances are named `pid_<pid>_luid_…_phys_<n>`.
    pid_prefix: String,
}

struct Query {
    handle: PDH_HQUERY,
    adapter: PDH_HCOUNTER,
    process: PDH_HCOUNTER,
}

impl Drop for Query {
    fn drop(&mut self) {
        // SAFETY: `handle` came from a successful PdhOpenQueryW and is closed exactly once.
        unsafe {
            PdhCloseQuery(self.handle);
        }
    }
}

impl SharedMemorySource {
    pub(super) fn open() -> Self {
        Self {
            query: open_query(),
            pid_prefix: format!("pid_{}_", std::process::id()),
        }
    }

    pub(super) fn status(&self) -> Result<(), String> {
        self.query.as_ref().map(|_| ()).map_err(Clone::clone)
    }

    pub(super) fn sample(&mut self, sample: &mut Sample) {
        let Ok(query) = &self.query else { return };
        // SAFETY: the query handle is open for the lifetime of `self`.
        if unsafe { PdhCollectQueryData(query.handle) } != 0 {
            return;
        }
        let Some(adapter) = counter_values(query.adapter) else {
            return;
        };
        let process = counter_values(query.process).unwrap_or_default();
        sample.shared = Some(SharedMemorySample {
            adapter_bytes: adapter.iter().map(|(_, v)| *v).sum(),
            process_bytes: process
                .iter()
                .filter(|(name, _)| name.starts_with(&self.pid_prefix))
                .map(|(_, v)| *v)
                .sum(),
        });
    }
}

fn open_query() -> Result<Query, String> {
    let mut handle: PDH_HQUERY = std::ptr::null_mut();
    // SAFETY: a null data source means live counters; `handle` is a valid out pointer.
    let status = unsafe { PdhOpenQueryW(std::ptr::null(), 0, &mut handle) };
    if status != 0 {
        return Err(format!("cannot open a PDH query (status {status:#x})"));
    }
    // Owned from here on, so every early return closes the query.
    let mut query = Query {
        handle,
        adapter: std::ptr::null_mut(),
        process: std::ptr::null_mut(),
    };
    query.adapter = add_counter(handle, ADAPTER_COUNTER)?;
    query.process = add_counter(handle, PROCESS_COUNTER)?;
    // Rate counters need a first collection; these are plain gauges but priming keeps the first sample valid.
    // SAFETY: the query handle is open.
    unsafe {
        PdhCollectQueryData(query.handle);
    }
    Ok(query)
}

fn add_counter(query: PDH_HQUERY, path: &str) -> Result<PDH_HCOUNTER, String> {
    let wide: Vec<u16> = path.encode_utf16().chain(std::iter::once(0)).collect();
    let mut counter: PDH_HCOUNTER = std::ptr::null_mut();
    // SAFETY: `wide` is NUL-terminated and outlives the call; `counter` is a valid out pointer.
    let status = unsafe { PdhAddEnglishCounterW(query, wide.as_ptr(), 0, &mut counter) };
    if status == 0 {
        Ok(counter)
    } else {
        Err(format!(
            "the PDH counter {path} is not available (status {status:#x})"
        ))
    }
}

/// Every instance of a wildcard counter as (instance name, bytes).
fn counter_values(counter: PDH_HCOUNTER) -> Option<Vec<(String, u64)>> {
    if counter.is_null() {
        return None;
    }
    let mut size_bytes = 0u32;
    let mut count = 0u32;
    // SAFETY: a null buffer with size 0 asks PDH for the size it needs.
    let status = unsafe {
        PdhGetFormattedCounterArrayW(
            counter,
            PDH_FMT_LARGE,
            &mut size_bytes,
            &mut count,
            std::ptr::null_mut(),
        )
    };
    if status != PDH_MORE_DATA {
        return None;
    }
    // u64 storage gives the 8-byte alignment the item structs need.
    let mut buffer = vec![0u64; (size_bytes as usize).div_ceil(8)];
    let items = buffer.as_mut_ptr().cast::<PDH_FMT_COUNTERVALUE_ITEM_W>();
    // SAFETY: `buffer` holds at least `size_bytes` bytes, as PDH asked for.
    let status = unsafe {
        PdhGetFormattedCounterArrayW(counter, PDH_FMT_LARGE, &mut size_bytes, &mut count, items)
    };
    if status != 0 {
        return None;
    }
    // SAFETY: PDH wrote `count` items at the start of `buffer`, which stays alive for this function.
    let items = unsafe { std::slice::from_raw_parts(items, count as usize) };
    let values = items
        .iter()
        .filter(|item| VALID_STATUSES.contains(&item.FmtValue.CStatus))
        .map(|item| {
            // SAFETY: PDH_FMT_LARGE fills the `largeValue` member; names are NUL-terminated strings in `buffer`.
            let value = unsafe { item.FmtValue.Anonymous.largeValue };
            let name = unsafe { wide_to_string(item.szName) };
            (name, u64::try_from(value).unwrap_or(0))
        })
        .collect();
    Some(values)
}

/// # Safety
/// `ptr` is null or points to a NUL-terminated UTF-16 string.
unsafe fn wide_to_string(ptr: *const u16) -> String {
    if ptr.is_null() {
        return String::new();
    }
    let mut len = 0;
    // SAFETY: the caller guarantees a terminating NUL.
    while unsafe { *ptr.add(len) } != 0 {
        len += 1;
    }
    // SAFETY: `len` code units were just read.
    String::from_utf16_lossy(unsafe { std::slice::from_raw_parts(ptr, len) })
}
