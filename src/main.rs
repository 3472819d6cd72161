//! The `framesmith` binary: parses the command line and runs a headless command (the GUI comes later).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "framesmith",
    version,
    about = "Train LoRA adapters for Wan video diffusion models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compare a module against a reference fixture directory made by the official Wan code
    CheckParity {
        /// Fixture case directories (config.json + inputs/expected/weights safetensors)
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::CheckParity { dirs } => check_parity(&dirs),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn check_parity(dirs: &[PathBuf]) -> anyhow::Result<ExitCode> {
    let (mut passed, mut failed) = (0usize, 0usize);
    for dir in dirs {
        println!("{}", dir.display());
        match framesmith::parity::check_fixture(dir) {
            Ok(rows) => {
                for row in rows {
                    println!("  {row}");
                    if row.passed {
                        passed += 1;
                    } else {
                        failed += 1;
                    }
                }
            }
            Err(err) => {
                println!("  FAIL {err:#}");
                failed += 1;
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
