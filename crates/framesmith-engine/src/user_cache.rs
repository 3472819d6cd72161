//! What Framesmith keeps between runs of every project, in the user's cache folder: `FRAMESMITH_CACHE_DIR` when
//! set, else the platform's cache folder (`~/.cache/framesmith` on Linux, `%LOCALAPPDATA%\framesmith` on
//! Windows). Deleting it only makes the next run rebuild what it held.

use std::path::PathBuf;

/// The variable that moves the cache folder (an empty value turns keeping plans off).
pub const CACHE_DIR_VAR: &str = "FRAMESMITH_CACHE_DIR";

/// The cache folder, or `None` when `FRAMESMITH_CACHE_DIR` is empty or the platform has none.
pub fn cache_root() -> Option<PathBuf> {
    root_from(std::env::var_os(CACHE_DIR_VAR), dirs::cache_dir())
}

fn root_from(var: Option<std::ffi::OsString>, platform: Option<PathBuf>) -> Option<PathBuf> {
    match var {
        Some(v) if v.is_empty() => None,
        Some(v) => Some(PathBuf::from(v)),
        None => platform.map(|p| p.join("framesmith")),
    }
}

/// Keeps cuDNN's attention plans under the cache folder (`attention-plans/`), so a later run skips building them.
pub fn keep_attention_plans() {
    let folder = cache_root().map(|root| root.join("attention-plans"));
    framesmith_nn::attention::plans::keep_plans_in(folder.as_deref());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_moves_the_folder_or_turns_it_off() {
        let platform = Some(PathBuf::from("/home/u/.cache"));
        assert_eq!(
            root_from(None, platform.clone()),
            Some(PathBuf::from("/home/u/.cache/framesmith"))
        );
        assert_eq!(
            root_from(Some("/fast/cache".into()), platform.clone()),
            Some(PathBuf::from("/fast/cache"))
        );
        assert_eq!(root_from(Some("".into()), platform), None);
        assert_eq!(root_from(None, None), None);
    }
}
