//! Where the reference fixtures live, for tests in every crate: `shared/fixtures/<family>/<case>` beside the
//! checkout (`../shared`), or beside a folder above it (a worktree or a workspace crate a few levels deeper).

use std::path::{Path, PathBuf};

/// The fixtures of one model family (`wan`, `flux`): the nearest `shared/fixtures/<family>` found walking up from
/// this crate's folder, or the one beside the checkout when none exists (so a missing fixture names a real path).
pub fn family_dir(family: &str) -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    crate_dir
        .ancestors()
        .skip(1)
        .map(|dir| dir.join("shared/fixtures").join(family))
        .find(|dir| dir.is_dir())
        .unwrap_or_else(|| crate_dir.join("../shared/fixtures").join(family))
}

/// The folder of one fixture case of `family`.
pub fn case_dir(family: &str, case: &str) -> PathBuf {
    family_dir(family).join(case)
}

/// The folder of one Wan fixture case.
pub fn wan_case(case: &str) -> PathBuf {
    case_dir("wan", case)
}
