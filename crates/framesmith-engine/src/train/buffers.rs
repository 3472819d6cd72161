//! The step's page-locked activation buffers set aside while the run's model is built, rather than by the first
//! step as it needs them: a family's setup starts them once the device is open (sized by the memory plan, one
//! buffer per block), and the trainer waits for them and hands them to the step just before the first one. Only
//! when the step keeps its saved activations in page-locked RAM; where it cannot be done the step page-locks them
//! itself, as before, and the log says why.

use candle_core::Device;

use crate::train::placements::saved_inputs_for;
use crate::train::trainer::Trainer;
use framesmith_config::protocol::memory::{format_gib, PlanReport};
use framesmith_config::protocol::LogLevel;
use framesmith_config::RunPlan;
use framesmith_nn::offload::{ActivationBuffers, SavedPlacement};

/// Starts page-locking the step's activation buffers beside the setup when the step keeps its saved activations
/// in page-locked RAM (the placement the trainer will use: `[memory]`'s, or `report`'s choice). `blocks` is what
/// the plan says each block keeps there ([`crate::plan::host_activation_blocks`]), or why it could not say.
pub(crate) fn start_activation_buffers(
    (plan, report): (&RunPlan, Option<&PlanReport>),
    device: &Device,
    blocks: Result<Vec<u64>, String>,
    log: &mut dyn FnMut(LogLevel, String),
) -> Option<ActivationBuffers> {
    // A placement that cannot be settled fails the setup later, with its own message; nothing is locked for it.
    let placement = saved_inputs_for(plan, device, report).ok()?;
    let sizes = match buffer_sizes(placement, blocks) {
        Ok(Some(sizes)) => sizes,
        Ok(None) => return None,
        Err(why) => {
            log(LogLevel::Info, why);
            return None;
        }
    };
    let total: u64 = sizes.iter().map(|&b| b as u64).sum();
    let count = sizes.len();
    match ActivationBuffers::start(device, sizes) {
        Ok(Some(buffers)) => {
            log(
                LogLevel::Info,
                format!(
                    "activation buffers: page-locking {} for the saved activations ({count} blocks) beside the \
                     model's build",
                    format_gib(total)
                ),
            );
            Some(buffers)
        }
        Ok(None) => None,
        Err(e) => {
            log(
                LogLevel::Warn,
                format!(
                    "activation buffers: cannot start the thread that page-locks them beside the setup ({e}); the \
                     first step page-locks them as it needs them"
                ),
            );
            None
        }
    }
}

/// The buffers to set aside for a step whose saved activations wait at `placement`: one per block of what the
/// plan says it keeps (`blocks`), none unless they are page-locked; an error (the log line) when the plan could
/// not size them.
fn buffer_sizes(
    placement: SavedPlacement,
    blocks: Result<Vec<u64>, String>,
) -> Result<Option<Vec<usize>>, String> {
    if placement != SavedPlacement::PageLocked {
        return Ok(None);
    }
    let not_sized = |why: String| {
        format!(
            "activation buffers: not set aside beside the setup ({why}); the first step page-locks them as it needs \
             them"
        )
    };
    let blocks = blocks.map_err(not_sized)?;
    let sizes = blocks
        .iter()
        .map(|&b| usize::try_from(b))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| {
            not_sized("a block's activations exceed this machine's address space".into())
        })?;
    Ok((sizes.iter().any(|&b| b > 0)).then_some(sizes))
}

impl Trainer {
    /// Waits for the activation buffers page-locked beside the setup and hands them to the step (call it just
    /// before the first step): the log line saying what they took, `None` when there were none. The first-step
    /// line names them among what ran beside the setup.
    pub fn install_activation_buffers(&mut self) -> Option<(LogLevel, String)> {
        let report = self.activation_buffers.take()?.install();
        let level = if report.failure.is_some() {
            LogLevel::Warn
        } else {
            self.startup.ran_beside(format!(
                "activation buffers {} page-locked in {:.1} s",
                format_gib(report.bytes),
                report.secs
            ));
            LogLevel::Info
        };
        Some((level, report.describe()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_locked_activations_are_set_aside_one_buffer_per_block() {
        assert_eq!(
            buffer_sizes(SavedPlacement::PageLocked, Ok(vec![7, 7, 9])),
            Ok(Some(vec![7, 7, 9]))
        );
    }

    #[test]
    fn nothing_is_set_aside_unless_the_activations_are_page_locked() {
        for placement in [SavedPlacement::Device, SavedPlacement::Pageable] {
            assert_eq!(buffer_sizes(placement, Ok(vec![7, 7])), Ok(None));
        }
        assert_eq!(
            buffer_sizes(SavedPlacement::PageLocked, Ok(vec![0, 0])),
            Ok(None)
        );
        assert_eq!(
            buffer_sizes(SavedPlacement::PageLocked, Ok(vec![])),
            Ok(None)
        );
    }

    #[test]
    fn a_plan_that_cannot_size_them_leaves_them_to_the_first_step() {
        let why =
            buffer_sizes(SavedPlacement::PageLocked, Err("no model header".into())).unwrap_err();
        assert_eq!(
            why,
            "activation buffers: not set aside beside the setup (no model header); the first step page-locks them \
             as it needs them"
        );
    }
}
