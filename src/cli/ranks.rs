//! `framesmith train` over several GPUs: `--gpus 0,1,...` launches one process per GPU on this machine (the
//! binary again, with its rank, like torchrun), shows rank 0's output, and stops every rank when one dies;
//! `--rank`, `--world-size`, `--master-addr`, `--master-port` (or torchrun's RANK, WORLD_SIZE, MASTER_ADDR,
//! MASTER_PORT, LOCAL_RANK) run one rank by hand, for several machines (`framesmith_engine::train::launch`
//! resolves them).

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use framesmith_config::protocol::{wire, Event};
use framesmith_engine::train::launch::{rank_arguments, RankOptions};
use framesmith_engine::train::ranks::DEFAULT_TIMEOUT_SECS;

/// The rank options of `framesmith train`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RankArgs {
    /// Train on these GPUs of this machine, one process each (e.g. `--gpus 0,1`); with --rank, this rank's GPU
    #[arg(long, value_delimiter = ',', value_name = "IDS")]
    pub gpus: Vec<usize>,
    /// This process's rank when launching ranks by hand (0 on the machine that listens; env RANK)
    #[arg(long)]
    pub rank: Option<usize>,
    /// How many ranks (GPUs) train together, over all machines (env WORLD_SIZE)
    #[arg(long = "world-size")]
    pub world_size: Option<usize>,
    /// Rank 0's address, where it listens for the other ranks (env MASTER_ADDR; default 127.0.0.1)
    #[arg(long = "master-addr")]
    pub master_addr: Option<String>,
    /// Rank 0's port (env MASTER_PORT; default 29500, or a free one with --gpus)
    #[arg(long = "master-port")]
    pub master_port: Option<u16>,
    /// Seconds the ranks wait for each other to start, and for a lost rank before they stop
    #[arg(long = "rank-timeout", value_name = "SECS", default_value_t = DEFAULT_TIMEOUT_SECS)]
    pub rank_timeout_secs: u64,
}

impl RankArgs {
    /// The options as the engine reads them.
    pub fn options(&self) -> RankOptions {
        RankOptions {
            gpus: self.gpus.clone(),
            rank: self.rank,
            world_size: self.world_size,
            master_addr: self.master_addr.clone(),
            master_port: self.master_port,
            rank_timeout_secs: self.rank_timeout_secs,
        }
    }
}

/// A port nobody listens on now, for rank 0.
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| {
        anyhow::anyhow!("cannot find a free port for the ranks ({e}); give --master-port")
    })?;
    Ok(listener.local_addr()?.port())
}

fn describe(status: ExitStatus) -> String {
    match status.code() {
        Some(code) => format!("exited with code {code}"),
        None => format!("was killed ({status})"),
    }
}

/// Asks a rank to stop and save, as Ctrl-C does (SIGTERM on Unix; elsewhere it is ended).
fn terminate(child: &mut Child) {
    #[cfg(unix)]
    {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
    }
    #[cfg(not(unix))]
    {
        let _ = child.kill();
    }
}

/// Runs `framesmith train` once per GPU of `gpus` (rank `i` on `gpus[i]`), shows rank 0's output and the other
/// ranks' errors, and waits for all. When a rank fails the others stop by themselves (they learn it through
/// their connection to rank 0, and rank 0 saves the last good LoRA); any still running `timeout_secs` later are
/// ended. Returns rank 0's exit code, or failure when another rank failed. With `events_json` (the app's run),
/// rank 0 reads the launcher's stdin for commands, and the launcher first writes the ranks' process ids as an
/// event on stdout, where rank 0's events follow.
pub fn launch_local(
    gpus: &[usize],
    port: Option<u16>,
    timeout_secs: u64,
    own_args: &[OsString],
    events_json: bool,
) -> anyhow::Result<ExitCode> {
    // Said once here, before any rank starts, rather than by every rank.
    framesmith_nn::collective::several_gpus_supported().map_err(anyhow::Error::msg)?;
    let exe = std::env::current_exe().map_err(|e| {
        anyhow::anyhow!("cannot find the framesmith binary to start the ranks ({e})")
    })?;
    let port = match port {
        Some(p) => p,
        None => free_port()?,
    };
    let interrupts = Arc::new(AtomicUsize::new(0));
    {
        let interrupts = interrupts.clone();
        // Ctrl-C reaches every rank from the terminal; the launcher only counts it (and passes on a SIGTERM).
        let _ = ctrlc::set_handler(move || {
            interrupts.fetch_add(1, Ordering::SeqCst);
        });
    }
    eprintln!(
        "training on GPUs {} ({} ranks; rank 0 listens on 127.0.0.1:{port})",
        gpus.iter()
            .map(|g| g.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        gpus.len()
    );
    let mut ranks = Vec::with_capacity(gpus.len());
    for rank in 0..gpus.len() {
        let args = rank_arguments(own_args, rank, gpus, port, timeout_secs);
        let stdin = if rank == 0 && events_json {
            Stdio::inherit()
        } else {
            Stdio::null()
        };
        match spawn_rank(&exe, args, stdin, rank, gpus[rank]) {
            Ok(child) => ranks.push(child),
            Err(e) => {
                ranks.iter_mut().for_each(|c: &mut Child| {
                    let _ = c.kill();
                });
                return Err(e);
            }
        }
    }
    if events_json {
        let pids = ranks.iter().map(Child::id).collect();
        match wire::event_line(&Event::ProcessesStarted { pids }) {
            Ok(line) => println!("{line}"),
            Err(err) => eprintln!("warning: {err}"),
        }
    }
    let statuses = supervise(&mut ranks, gpus, timeout_secs, &interrupts);
    let failed: Vec<String> = statuses
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.success())
        .map(|(r, s)| format!("rank {r} {}", describe(*s)))
        .collect();
    if failed.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    let interrupted = i32::from(super::interrupt::EXIT_INTERRUPTED);
    if interrupts.load(Ordering::SeqCst) > 0
        || statuses.iter().all(|s| s.code() == Some(interrupted))
    {
        // Stopped on request: every rank saved (rank 0 said where); a script should learn it did not finish.
        return Ok(ExitCode::from(super::interrupt::EXIT_INTERRUPTED));
    }
    eprintln!("ranks that failed: {}", failed.join("; "));
    let code = statuses
        .first()
        .and_then(|s| s.code())
        .filter(|&c| c != 0)
        .and_then(|c| u8::try_from(c).ok())
        .unwrap_or(1);
    Ok(ExitCode::from(code))
}

/// Starts rank `rank` on GPU `gpu`: rank 0's output goes to this terminal; another rank's errors and warnings
/// are shown labelled (its progress is rank 0's).
fn spawn_rank(
    exe: &std::path::Path,
    args: Vec<OsString>,
    stdin: Stdio,
    rank: usize,
    gpu: usize,
) -> anyhow::Result<Child> {
    let mut command = Command::new(exe);
    command.args(args).stdin(stdin);
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        // NVLink multicast stays off (see the NCCL collective).
        command.env("NCCL_NVLS_ENABLE", "0");
    }
    for name in [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    ] {
        command.env_remove(name);
    }
    if rank > 0 {
        command.stdout(Stdio::null()).stderr(Stdio::piped());
    }
    let mut child = command
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start rank {rank} on GPU {gpu} ({e})"))?;
    if let Some(stderr) = child.stderr.take() {
        let _ = std::thread::Builder::new()
            .name(format!("rank-{rank}-output"))
            .spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let line = line.trim_start_matches('\r');
                    if line.starts_with("error") || line.starts_with("warning") {
                        eprintln!("[rank {rank}, GPU {gpu}] {line}");
                    }
                }
            });
    }
    Ok(child)
}

/// Waits for every rank. After a rank fails, the ones still running `timeout_secs` later are ended; an interrupt
/// of the launcher alone (SIGTERM) is passed on, a second one ends every rank.
fn supervise(
    ranks: &mut [Child],
    gpus: &[usize],
    timeout_secs: u64,
    interrupts: &AtomicUsize,
) -> Vec<ExitStatus> {
    let mut ended: Vec<Option<ExitStatus>> = vec![None; ranks.len()];
    let mut stop_by: Option<Instant> = None;
    let mut forwarded = 0;
    while ended.iter().any(Option::is_none) {
        for (rank, child) in ranks.iter_mut().enumerate() {
            if ended[rank].is_some() {
                continue;
            }
            let Ok(Some(status)) = child.try_wait() else {
                continue;
            };
            ended[rank] = Some(status);
            if !status.success() && stop_by.is_none() && ended.iter().any(Option::is_none) {
                eprintln!(
                    "error: rank {rank} (GPU {}) {}; the other ranks stop (rank 0 keeps the last saved \
                     checkpoint); any still running in {timeout_secs} s are ended",
                    gpus[rank],
                    describe(status)
                );
                stop_by = Some(Instant::now() + Duration::from_secs(timeout_secs));
            }
        }
        let pressed = interrupts.load(Ordering::SeqCst);
        if pressed > forwarded {
            forwarded = pressed;
            for (rank, child) in ranks.iter_mut().enumerate() {
                if ended[rank].is_none() {
                    if pressed > 1 {
                        let _ = child.kill();
                    } else {
                        terminate(child);
                    }
                }
            }
        }
        if stop_by.is_some_and(|t| Instant::now() >= t) {
            for (rank, child) in ranks.iter_mut().enumerate() {
                if ended[rank].is_none() {
                    eprintln!(
                        "error: rank {rank} (GPU {}) did not stop in time: ending it",
                        gpus[rank]
                    );
                    let _ = child.kill();
                }
            }
            stop_by = None;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    ended.into_iter().flatten().collect()
}
