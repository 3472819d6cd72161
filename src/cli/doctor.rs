//! `framesmith doctor`: checks this build and this machine for training — GPUs, driver, CUDA libraries,
//! attention, memory, ffmpeg, the disk of the output folder — and prints each problem with its fix. Exits with 0
//! when nothing blocks training, [`EXIT_BLOCKED`] when something does (1 on an error, 2 on bad flags).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use framesmith_config::RunConfig;

/// Exit status when a problem blocks training.
pub const EXIT_BLOCKED: u8 = 3;

/// `doctor` options.
#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Output folder whose disk is checked (default: the run config default, `output`)
    #[arg(long, value_name = "DIR")]
    output: Option<PathBuf>,
    /// Check the output folder of this run config
    #[arg(long, conflicts_with = "output")]
    config: Option<PathBuf>,
    /// Print the report as JSON
    #[arg(long)]
    json: bool,
}

/// Runs `framesmith doctor`.
pub fn run(args: &DoctorArgs) -> anyhow::Result<ExitCode> {
    let output = match (&args.output, &args.config) {
        (Some(dir), _) => dir.clone(),
        (None, Some(path)) => RunConfig::load(path)?.output.output_dir,
        (None, None) => RunConfig::default().output.output_dir,
    };
    let report = framesmith_engine::doctor::check(&output);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    Ok(if report.blocks_training() {
        ExitCode::from(EXIT_BLOCKED)
    } else {
        ExitCode::SUCCESS
    })
}
