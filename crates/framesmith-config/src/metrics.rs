//! `metrics.jsonl`, read back: one training row per optimizer step (`step`, `epoch`, `loss`, `lr`, …) and, with
//! validation, one row per evaluation marked `"kind": "validation"` with its `val_loss`. A row without `kind` is a
//! training row, as in every file written before validation existed; readers skip kinds they do not know.

use crate::protocol::ValidationLoss;

/// One optimizer step's row.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRow {
    pub step: usize,
    pub epoch: usize,
    /// `None` when the step's loss was not finite (written as `null`).
    pub loss: Option<f64>,
    pub learning_rate: f64,
    pub step_secs: f64,
}

/// One row of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq)]
pub enum MetricsRow {
    Step(StepRow),
    Validation(ValidationLoss),
    /// A row of a kind this version does not know (written by a newer one).
    Other,
}

/// Reads one line; an error says what is wrong with it.
pub fn parse_row(line: &str) -> Result<MetricsRow, String> {
    let value: serde_json::Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
    let step = value["step"]
        .as_u64()
        .ok_or("a metrics row without a step")? as usize;
    let count = |key: &str| value[key].as_u64().unwrap_or(0) as usize;
    Ok(match value["kind"].as_str() {
        None | Some("step") => MetricsRow::Step(StepRow {
            step,
            epoch: value["epoch"].as_u64().unwrap_or(1) as usize,
            loss: value["loss"].as_f64(),
            learning_rate: value["lr"].as_f64().unwrap_or(0.0),
            step_secs: value["step_secs"].as_f64().unwrap_or(0.0),
        }),
        Some("validation") => MetricsRow::Validation(ValidationLoss {
            step,
            loss: value["val_loss"].as_f64().unwrap_or(f64::NAN),
            items: count("items"),
            timesteps: count("timesteps"),
        }),
        Some(_) => MetricsRow::Other,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn old_rows_read_as_steps_and_validation_rows_as_validation() {
        let old = r#"{"step":3,"epoch":1,"loss":0.25,"lr":0.0002,"step_secs":0.5,"grad_norm":0.1,"skipped":false}"#;
        assert_eq!(
            parse_row(old).unwrap(),
            MetricsRow::Step(StepRow {
                step: 3,
                epoch: 1,
                loss: Some(0.25),
                learning_rate: 0.0002,
                step_secs: 0.5
            })
        );
        let skipped =
            r#"{"step":4,"epoch":1,"loss":null,"lr":0.0002,"step_secs":0.5,"skipped":true}"#;
        assert!(matches!(
            parse_row(skipped).unwrap(),
            MetricsRow::Step(StepRow { loss: None, .. })
        ));
        let validation = r#"{"kind":"validation","step":10,"val_loss":0.125,"items":2,"timesteps":4,"secs":0.1}"#;
        assert_eq!(
            parse_row(validation).unwrap(),
            MetricsRow::Validation(ValidationLoss {
                step: 10,
                loss: 0.125,
                items: 2,
                timesteps: 4
            })
        );
        assert_eq!(
            parse_row(r#"{"kind":"later","step":1}"#).unwrap(),
            MetricsRow::Other
        );
        assert!(parse_row("{\"loss\":1.0}").is_err());
        assert!(parse_row("not json").is_err());
    }
}
