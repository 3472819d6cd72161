//! `[lora]` as a config file writes it: every field optional, and `alpha`, when left out, the kind's default
//! ([`LoraKind::default_alpha`]) rather than one number for every kind.

use std::path::PathBuf;

use serde::Deserialize;

use super::{LoraKind, LoraSection};

/// `[lora]` as a file writes it: [`LoraSection`] with `alpha` optional ([`LoraKind::default_alpha`] when absent).
#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct LoraFile {
    kind: LoraKind,
    rank: usize,
    alpha: Option<f64>,
    factor: i64,
    decompose_both: bool,
    full_matrix: bool,
    include_patterns: Vec<String>,
    exclude_patterns: Vec<String>,
    init_from: Option<PathBuf>,
}

impl Default for LoraFile {
    fn default() -> Self {
        let d = LoraSection::default();
        Self {
            kind: d.kind,
            rank: d.rank,
            alpha: None,
            factor: d.factor,
            decompose_both: d.decompose_both,
            full_matrix: d.full_matrix,
            include_patterns: d.include_patterns,
            exclude_patterns: d.exclude_patterns,
            init_from: d.init_from,
        }
    }
}

impl From<LoraFile> for LoraSection {
    fn from(f: LoraFile) -> Self {
        Self {
            kind: f.kind,
            rank: f.rank,
            alpha: f.alpha.unwrap_or_else(|| f.kind.default_alpha()),
            factor: f.factor,
            decompose_both: f.decompose_both,
            full_matrix: f.full_matrix,
            include_patterns: f.include_patterns,
            exclude_patterns: f.exclude_patterns,
            init_from: f.init_from,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> LoraSection {
        toml::from_str(text).unwrap()
    }

    /// A LoHa section without `alpha` takes 1 whatever its rank; one that sets it keeps it; the other kinds keep
    /// the section default; unknown keys are still refused.
    #[test]
    fn a_left_out_alpha_is_the_kinds_default() {
        assert_eq!(read("kind = \"loha\"\nrank = 16").alpha, 1.0);
        assert_eq!(read("kind = \"loha\"").alpha, 1.0);
        assert_eq!(read("kind = \"loha\"\nrank = 16\nalpha = 16.0").alpha, 16.0);
        for kind in ["lora", "lokr", "dora"] {
            let section = read(&format!("kind = \"{kind}\"\nrank = 16"));
            assert_eq!(section.alpha, LoraSection::default().alpha, "{kind}");
        }
        assert_eq!(read(""), LoraSection::default());
        assert!(toml::from_str::<LoraSection>("alfa = 1.0").is_err());
    }
}
