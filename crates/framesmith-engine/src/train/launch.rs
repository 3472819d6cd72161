//! How a process of `framesmith train` learns its part in a run over several GPUs: the rank options (or torchrun's
//! environment variables RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK) resolved to a [`Launch`], and
//! the command line of each rank that `--gpus` starts.

use std::ffi::OsString;
use std::time::Duration;

use crate::train::ranks::RankSpec;

/// The rank options of `framesmith train`, as given on the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RankOptions {
    /// `--gpus`: the GPUs of this machine to launch ranks on; with `--rank`, this rank's one GPU.
    pub gpus: Vec<usize>,
    pub rank: Option<usize>,
    pub world_size: Option<usize>,
    pub master_addr: Option<String>,
    pub master_port: Option<u16>,
    pub rank_timeout_secs: u64,
}

/// What the rank options ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Launch {
    /// One process on the config's device.
    One,
    /// Start one process per GPU of this machine.
    Local(Vec<usize>),
    /// This process is one rank.
    Rank(RankSpec),
}

const DEFAULT_PORT: u16 = 29500;

/// Where rank 0 listens: the options, else torchrun's `MASTER_ADDR` / `MASTER_PORT`, else this machine.
fn master_of(
    args: &RankOptions,
    env: &impl Fn(&str) -> Option<String>,
) -> anyhow::Result<(String, u16)> {
    let port = match args.master_port {
        Some(p) => p,
        None => match env("MASTER_PORT") {
            Some(p) => p.trim().parse().map_err(|_| {
                anyhow::anyhow!("the environment variable MASTER_PORT is {p:?}, not a port number")
            })?,
            None => DEFAULT_PORT,
        },
    };
    let master_addr = args
        .master_addr
        .clone()
        .or_else(|| env("MASTER_ADDR"))
        .unwrap_or_else(|| "127.0.0.1".into());
    Ok((master_addr, port))
}

/// Reads the options, falling back on torchrun's environment variables (`env`) for a rank launched by hand.
pub fn resolve(args: &RankOptions, env: impl Fn(&str) -> Option<String>) -> anyhow::Result<Launch> {
    let number = |name: &str| -> anyhow::Result<Option<usize>> {
        match env(name) {
            None => Ok(None),
            Some(v) => v.trim().parse().map(Some).map_err(|_| {
                anyhow::anyhow!("the environment variable {name} is {v:?}, not a number")
            }),
        }
    };
    let rank = match args.rank {
        Some(r) => Some(r),
        None => number("RANK")?,
    };
    let world = match args.world_size {
        Some(w) => Some(w),
        None => number("WORLD_SIZE")?,
    };
    let timeout = Duration::from_secs(args.rank_timeout_secs.max(1));
    match (rank, world) {
        (None, None) => {}
        (Some(_), None) | (None, Some(_)) if args.rank.is_some() || args.world_size.is_some() => {
            anyhow::bail!(
                "a rank launched by hand needs both --rank and --world-size (and --master-addr / --master-port \
                 when rank 0 is on another machine)"
            )
        }
        (Some(rank), Some(world)) => {
            if world == 0 || rank >= world {
                anyhow::bail!(
                    "--rank {rank} does not exist in a world of {world}: ranks go from 0 to --world-size - 1"
                );
            }
            let gpu = match args.gpus.as_slice() {
                [] => number("LOCAL_RANK")?,
                [one] => Some(*one),
                many => anyhow::bail!(
                    "with --rank, --gpus names this rank's one GPU, not {} of them: launch one process per GPU, or \
                     use --gpus alone to have framesmith launch them",
                    many.len()
                ),
            };
            let (master_addr, port) = master_of(args, &env)?;
            let ranks_on_machine = match number("LOCAL_WORLD_SIZE")? {
                Some(n) => n.clamp(1, world),
                None if is_loopback(&master_addr) => world,
                None => 1,
            };
            return Ok(Launch::Rank(RankSpec {
                rank,
                world,
                gpu,
                master_addr,
                master_port: port,
                timeout,
                ranks_on_machine,
            }));
        }
        // Only one of RANK / WORLD_SIZE in the environment: not a torchrun-style launch.
        _ => {}
    }
    if args.master_addr.is_some() {
        anyhow::bail!("--master-addr is for ranks launched by hand: add --rank and --world-size");
    }
    match args.gpus.as_slice() {
        [] => Ok(Launch::One),
        gpus => {
            let mut seen = gpus.to_vec();
            seen.sort_unstable();
            seen.dedup();
            if seen.len() != gpus.len() {
                anyhow::bail!("--gpus names a GPU twice: {gpus:?}");
            }
            Ok(Launch::Local(gpus.to_vec()))
        }
    }
}

/// Whether `addr` is this machine's loopback (so every rank of the run is on this machine).
fn is_loopback(addr: &str) -> bool {
    addr.eq_ignore_ascii_case("localhost")
        || addr
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The command line for a rank: the launcher's own arguments without `--gpus`, plus the rank's options.
pub fn rank_arguments(
    own: &[OsString],
    rank: usize,
    gpus: &[usize],
    port: u16,
    timeout: u64,
) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut skip_next = false;
    for arg in own {
        if skip_next {
            skip_next = false;
            continue;
        }
        let text = arg.to_string_lossy();
        // The options the launcher sets for each rank (one value each).
        const SET: [&str; 3] = ["--gpus", "--master-port", "--rank-timeout"];
        if SET.contains(&text.as_ref()) {
            skip_next = true;
            continue;
        }
        if SET.iter().any(|o| text.starts_with(&format!("{o}="))) {
            continue;
        }
        out.push(arg.clone());
    }
    for (flag, value) in [
        ("--rank", rank.to_string()),
        ("--world-size", gpus.len().to_string()),
        ("--gpus", gpus[rank].to_string()),
        ("--master-addr", "127.0.0.1".to_string()),
        ("--master-port", port.to_string()),
        ("--rank-timeout", timeout.to_string()),
    ] {
        out.push(flag.into());
        out.push(value.into());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    #[allow(clippy::too_many_lines)] // one table of launches read top to bottom, each case beside its expectation
    fn options_and_environment_resolve_to_a_launch() {
        let args = RankOptions {
            rank_timeout_secs: 60,
            ..Default::default()
        };
        assert_eq!(resolve(&args, no_env).unwrap(), Launch::One);
        let local = RankOptions {
            gpus: vec![2, 3],
            ..args.clone()
        };
        assert_eq!(resolve(&local, no_env).unwrap(), Launch::Local(vec![2, 3]));
        let twice = RankOptions {
            gpus: vec![1, 1],
            ..args.clone()
        };
        assert!(resolve(&twice, no_env)
            .unwrap_err()
            .to_string()
            .contains("twice"));

        let by_hand = RankOptions {
            rank: Some(1),
            world_size: Some(4),
            master_addr: Some("10.0.0.5".into()),
            master_port: Some(1234),
            ..args.clone()
        };
        let Launch::Rank(spec) = resolve(&by_hand, no_env).unwrap() else {
            panic!("not a rank")
        };
        assert_eq!(
            (
                spec.rank,
                spec.world,
                spec.gpu,
                spec.master_addr.as_str(),
                spec.master_port
            ),
            (1, 4, None, "10.0.0.5", 1234)
        );
        // Rank 0 on another machine and no LOCAL_WORLD_SIZE: only this rank is known to be here.
        assert_eq!(spec.ranks_on_machine, 1);
        assert_eq!(spec.timeout, Duration::from_secs(60));

        // torchrun's variables, the options winning over them.
        let env = |name: &str| match name {
            "RANK" => Some("3".to_string()),
            "WORLD_SIZE" => Some("8".to_string()),
            "LOCAL_RANK" => Some("3".to_string()),
            "MASTER_ADDR" => Some("node0".to_string()),
            "MASTER_PORT" => Some("29600".to_string()),
            _ => None,
        };
        let Launch::Rank(spec) = resolve(&args, env).unwrap() else {
            panic!("not a rank")
        };
        assert_eq!(
            (
                spec.rank,
                spec.world,
                spec.gpu,
                spec.master_addr.as_str(),
                spec.master_port
            ),
            (3, 8, Some(3), "node0", 29600)
        );
        assert_eq!(spec.ranks_on_machine, 1);
        let local_world = |name: &str| match name {
            "LOCAL_WORLD_SIZE" => Some("4".to_string()),
            _ => env(name),
        };
        let Launch::Rank(spec) = resolve(&args, local_world).unwrap() else {
            panic!("not a rank")
        };
        assert_eq!(spec.ranks_on_machine, 4);
        // The ranks `--gpus` starts meet at 127.0.0.1: all of them are on this machine.
        let launched = RankOptions {
            rank: Some(1),
            world_size: Some(2),
            gpus: vec![1],
            master_addr: Some("127.0.0.1".into()),
            ..args.clone()
        };
        let Launch::Rank(spec) = resolve(&launched, no_env).unwrap() else {
            panic!("not a rank")
        };
        assert_eq!(spec.ranks_on_machine, 2);
        let over = RankOptions {
            rank: Some(0),
            gpus: vec![5],
            ..args.clone()
        };
        let Launch::Rank(spec) = resolve(&over, env).unwrap() else {
            panic!("not a rank")
        };
        assert_eq!((spec.rank, spec.gpu), (0, Some(5)));

        let half = RankOptions {
            rank: Some(0),
            ..args.clone()
        };
        assert!(resolve(&half, no_env)
            .unwrap_err()
            .to_string()
            .contains("--world-size"));
        let outside = RankOptions {
            rank: Some(4),
            world_size: Some(4),
            ..args.clone()
        };
        assert!(resolve(&outside, no_env)
            .unwrap_err()
            .to_string()
            .contains("does not exist"));
        let bad = |name: &str| (name == "WORLD_SIZE" || name == "RANK").then(|| "two".to_string());
        assert!(resolve(&args, bad)
            .unwrap_err()
            .to_string()
            .contains("not a number"));
    }

    #[test]
    fn ranks_get_the_launchers_arguments_with_their_own_rank() {
        let own: Vec<OsString> = [
            "train",
            "--config",
            "a.toml",
            "--gpus",
            "0,1",
            "--master-port=9",
            "--rank-timeout",
            "5",
            "--resume",
            "r",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        let args: Vec<String> = rank_arguments(&own, 1, &[4, 6], 777, 30)
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args.join(" "),
            "train --config a.toml --resume r --rank 1 --world-size 2 --gpus 6 --master-addr 127.0.0.1 \
             --master-port 777 --rank-timeout 30"
        );
    }
}
