//! What validation checks differently for each model family, one file per family behind [`FamilyRules`];
//! [`rules`] is the one place the config crate turns a [`ModelFamily`] into its rules. A family's own settings
//! ([`FamilySetting`]: a run-config key only its models read) are listed here too, so the app's form and
//! `framesmith plan` offer them without naming the family.

use std::path::Path;

use crate::error::ConfigError;
use crate::plan::ModelFamily;
use crate::run::{RunConfig, TrainingMode};
use crate::validate::Checker;

mod cached;
mod flux;
mod hunyuan_video15;
mod ltx2;
mod qwen_image;
mod wan;

/// A family's part of validating a run config.
pub(crate) trait FamilyRules: Sync {
    /// The model files samples of the family's runs need: (key, path, what it is for).
    fn sampling_files<'a>(&self, cfg: &'a RunConfig)
        -> Vec<(&'static str, &'a Path, &'static str)>;
    /// What `model.clip` holds for the family's runs, as messages name it.
    fn clip_file(&self) -> &'static str;
    /// The family's own checks of `cfg` (`validation_scheduled`: `[validation]` asks for evaluations).
    fn check(&self, _c: &mut Checker, _cfg: &RunConfig, _validation_scheduled: bool) {}
    /// The settings only this family's models read.
    fn settings(&self) -> &'static [FamilySetting] {
        &[]
    }
    /// Whether its runs read `training.first_frame_conditioning_p` (the others refuse it).
    fn first_frame_conditioning(&self) -> bool {
        false
    }
}

/// A run-config key only one family's models read, with what the app and the command line show for it.
#[derive(Debug)]
pub struct FamilySetting {
    /// The dotted run-config key (`memory.flux_stream_order`).
    pub key: &'static str,
    /// The `framesmith plan` flag that sets it, without its dashes.
    pub flag: &'static str,
    /// The app's label.
    pub label: &'static str,
    /// The section of the app's form it goes in.
    pub section: &'static str,
    /// What it does, for `--help` and the app's hover text.
    pub help: &'static str,
    /// The values it takes, as TOML spells them.
    pub choices: &'static [&'static str],
}

impl FamilySetting {
    /// `cfg` with this setting set to `value`, one of its [`FamilySetting::choices`].
    pub fn apply(&self, cfg: &RunConfig, value: &str) -> Result<RunConfig, ConfigError> {
        if !self.choices.contains(&value) {
            return Err(ConfigError::Serialize {
                message: format!(
                    "--{} {value}: give one of {}",
                    self.flag,
                    self.choices.join(", ")
                ),
            });
        }
        let mut table = toml::Table::try_from(cfg).map_err(|e| ConfigError::Serialize {
            message: e.to_string(),
        })?;
        let mut overlay = toml::Value::String(value.to_string());
        for part in self.key.rsplit('.') {
            overlay = toml::Value::Table(toml::Table::from_iter([(part.to_string(), overlay)]));
        }
        if let toml::Value::Table(overlay) = overlay {
            crate::presets::merge(&mut table, &overlay);
        }
        serde::Deserialize::deserialize(table).map_err(|e: toml::de::Error| {
            ConfigError::Serialize {
                message: format!("{}: {e}", self.key),
            }
        })
    }
}

/// Every family's own settings.
pub fn family_settings() -> impl Iterator<Item = &'static FamilySetting> {
    [
        ModelFamily::Wan,
        ModelFamily::Flux,
        ModelFamily::QwenImage,
        ModelFamily::HunyuanVideo15,
        ModelFamily::Ltx2,
    ]
    .into_iter()
    .flat_map(|family| rules(family).settings())
}

/// The rules of `family`.
pub(crate) fn rules(family: ModelFamily) -> &'static dyn FamilyRules {
    match family {
        ModelFamily::Wan => &wan::WanRules,
        ModelFamily::Flux => &flux::FluxRules,
        ModelFamily::QwenImage => &qwen_image::QwenImageRules,
        ModelFamily::HunyuanVideo15 => &hunyuan_video15::HUNYUAN_VIDEO15_RULES,
        ModelFamily::Ltx2 => &ltx2::LTX2_RULES,
    }
}

/// The checks every image family's runs share: `model.variant` left `auto` (the model is read from `model.dit`),
/// no low-noise expert and no image-to-video mode. `model` names the DiT (`FLUX.1 [dev]`), `family` the family
/// (`FLUX.1`).
fn image_family_checks(c: &mut Checker, cfg: &RunConfig, (model, family): (&str, &str)) {
    let m = &cfg.model;
    if !m.variant.eq_ignore_ascii_case("auto") {
        c.problem(
            "model.variant",
            format!(
                "names the Wan variant `{}`, but model.dit is {model}",
                m.variant
            ),
            format!("set model.variant = \"auto\" ({family} is read from the file)"),
        );
    }
    if !m.dit_low_noise.as_os_str().is_empty() {
        c.problem(
            "model.dit_low_noise",
            format!("is for Wan2.2 A14B's low-noise expert; a {family} run trains one DiT"),
            "remove model.dit_low_noise",
        );
    }
    if cfg.training.mode == TrainingMode::ImageToVideo {
        c.problem(
            "training.mode",
            format!("image_to_video is for Wan; {model} trains text-to-image"),
            "remove training.mode or set it to \"auto\"",
        );
    }
}

// Tests may unwrap (STYLE.md: no unwrap outside tests).
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn each_family_setting_sets_its_key_to_each_choice_and_nothing_else() {
        assert!(family_settings().count() > 0);
        let base = RunConfig::default();
        let before = crate::presets::flatten(&toml::Table::try_from(&base).unwrap());
        for setting in family_settings() {
            for choice in setting.choices {
                let cfg = setting.apply(&base, choice).unwrap();
                let after = crate::presets::flatten(&toml::Table::try_from(&cfg).unwrap());
                assert_eq!(
                    after.get(setting.key),
                    Some(&toml::Value::String(choice.to_string()))
                );
                for (key, value) in &before {
                    if key != setting.key {
                        assert_eq!(after.get(key), Some(value), "{key}");
                    }
                }
            }
            let err = setting.apply(&base, "no_such_value").unwrap_err();
            assert!(err.to_string().contains(setting.flag), "{err}");
        }
    }
}
