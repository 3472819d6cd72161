//! How the ranks of a run find each other, like torchrun's MASTER_ADDR / MASTER_PORT: rank 0 listens on an
//! address and port, every other rank connects to it (retrying until the timeout, as ranks start in any order),
//! says who it is, and receives rank 0's payload (NCCL's unique id). The connections then stay open as a
//! lifeline: a rank that leaves (says goodbye) or dies (its connection closes without one) is reported to the
//! others at once — rank 0 passes the news on to every other rank — so none waits forever in a collective for it.
//! Every rank calls the same collectives, so a rank that leaves after its last one is never waited for: the
//! report matters only to a rank that still has collectives to call, which then fail instead of hanging.
//!
//! On the wire: a joining rank sends `FSRV`, the protocol version, its rank and the world size (u32 big-endian);
//! rank 0 answers a status byte (0 ok, 1 refused) and a length-prefixed payload or message. Afterwards a single
//! byte `B` is a goodbye, `A` followed by a length-prefixed message is rank 0 announcing a lost rank.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MAGIC: &[u8; 4] = b"FSRV";
const VERSION: u32 = 1;
const BYE: u8 = b'B';
const ABORT: u8 = b'A';
/// The longest payload or message accepted (an NCCL id is 128 bytes).
const MAX_PAYLOAD: u32 = 1 << 20;

/// Where and as whom a rank joins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RendezvousSpec {
    pub rank: usize,
    pub world: usize,
    /// Rank 0's host name or address (rank 0 listens on it).
    pub addr: String,
    pub port: u16,
    /// How long rank 0 waits for every rank, and the others for rank 0.
    pub timeout: Duration,
}

/// Why a rendezvous failed: a message for the user naming the address and what to check.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RendezvousError(pub String);

type Result<T> = std::result::Result<T, RendezvousError>;

fn err<T>(message: String) -> Result<T> {
    Err(RendezvousError(message))
}

/// Called once, from a watcher thread, with why the run cannot go on.
pub type LostHook = Box<dyn Fn(&str) + Send + Sync>;

#[derive(Default)]
struct LinkState {
    lost: Mutex<Option<String>>,
    closing: AtomicBool,
    hook: Mutex<Option<LostHook>>,
}

impl LinkState {
    /// Records the first loss and calls the hook; later ones are ignored.
    fn lose(&self, why: String) {
        if self.closing.load(Ordering::SeqCst) {
            return;
        }
        {
            let Ok(mut lost) = self.lost.lock() else {
                return;
            };
            if lost.is_some() {
                return;
            }
            *lost = Some(why.clone());
        }
        if let Ok(hook) = self.hook.lock() {
            if let Some(hook) = hook.as_ref() {
                hook(&why);
            }
        }
    }
}

/// The open connections between the ranks after a rendezvous (rank 0: one per other rank; the others: one to
/// rank 0), watched by a thread each. Dropping it says goodbye.
pub struct Link {
    rank: usize,
    peers: Vec<(usize, TcpStream)>,
    state: Arc<LinkState>,
}

impl Link {
    /// Why no collective can succeed any more (a rank left, died, or was reported gone); `None` while all are
    /// there.
    pub fn lost(&self) -> Option<String> {
        self.state.lost.lock().ok().and_then(|l| l.clone())
    }

    /// Sets what to do when a rank is lost (called from a watcher thread); called at once if one already was.
    pub fn on_lost(&self, hook: LostHook) {
        if let Some(why) = self.lost() {
            hook(&why);
        }
        if let Ok(mut slot) = self.state.hook.lock() {
            *slot = Some(hook);
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.state.closing.store(true, Ordering::SeqCst);
        for (_, stream) in &mut self.peers {
            let _ = stream.write_all(&[BYE]);
            let _ = stream.flush();
            let _ = stream.shutdown(std::net::Shutdown::Write);
        }
    }
}

fn write_u32(w: &mut impl Write, v: u32) -> std::io::Result<()> {
    w.write_all(&v.to_be_bytes())
}

fn read_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn write_blob(w: &mut impl Write, bytes: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(bytes.len()).unwrap_or(MAX_PAYLOAD);
    write_u32(w, len)?;
    w.write_all(&bytes[..len as usize])?;
    w.flush()
}

fn read_blob(r: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let len = read_u32(r)?;
    if len > MAX_PAYLOAD {
        return Err(std::io::Error::new(
            ErrorKind::InvalidData,
            format!("a message of {len} bytes"),
        ));
    }
    let mut bytes = vec![0u8; len as usize];
    r.read_exact(&mut bytes)?;
    Ok(bytes)
}

fn resolve(spec: &RendezvousSpec) -> Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = match (spec.addr.as_str(), spec.port).to_socket_addrs() {
        Ok(a) => a.collect(),
        Err(e) => {
            return err(format!(
                "cannot resolve the master address {}:{} ({e}): set --master-addr (or MASTER_ADDR) to rank 0's \
                 host name or IP address",
                spec.addr, spec.port
            ))
        }
    };
    if addrs.is_empty() {
        return err(format!(
            "the master address {} resolves to nothing",
            spec.addr
        ));
    }
    Ok(addrs)
}

/// Joins the run described by `spec`. Rank 0 listens, waits for every other rank, then sends each the bytes
/// `payload` returns; the other ranks return those bytes. Fails, naming the address, when the ranks do not all
/// arrive within `spec.timeout`, or disagree on the world size.
pub fn rendezvous(
    spec: &RendezvousSpec,
    payload: impl FnOnce() -> std::result::Result<Vec<u8>, String>,
) -> Result<(Vec<u8>, Link)> {
    if spec.world == 0 || spec.rank >= spec.world {
        return err(format!(
            "rank {} does not exist in a world of {} (ranks are 0 to world size - 1)",
            spec.rank, spec.world
        ));
    }
    if spec.rank == 0 {
        host(spec, payload)
    } else {
        join(spec)
    }
}

fn host(
    spec: &RendezvousSpec,
    payload: impl FnOnce() -> std::result::Result<Vec<u8>, String>,
) -> Result<(Vec<u8>, Link)> {
    let addrs = resolve(spec)?;
    let listener = TcpListener::bind(&addrs[..]).or_else(|e| {
        err(format!(
            "rank 0 cannot listen on {}:{} ({e}): choose a free --master-port (MASTER_PORT), and a --master-addr \
             (MASTER_ADDR) that is an address of this machine",
            spec.addr, spec.port
        ))
    })?;
    let payload = payload().map_err(RendezvousError)?;
    listener
        .set_nonblocking(true)
        .map_err(|e| RendezvousError(format!("rank 0: cannot poll its listener ({e})")))?;
    let deadline = Instant::now() + spec.timeout;
    let mut peers: Vec<(usize, TcpStream)> = Vec::new();
    while peers.len() + 1 < spec.world {
        let (mut stream, from) = match listener.accept() {
            Ok(s) => s,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let mut missing: Vec<String> = (1..spec.world)
                        .filter(|r| peers.iter().all(|(p, _)| p != r))
                        .map(|r| r.to_string())
                        .collect();
                    missing.truncate(16);
                    return err(format!(
                        "rank 0 waited {:.0?} on {}:{} and rank(s) {} never joined: start every rank with the same \
                         --world-size, --master-addr and --master-port, and check that this port is reachable \
                         from their machines",
                        spec.timeout,
                        spec.addr,
                        spec.port,
                        missing.join(", ")
                    ));
                }
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(e) => return err(format!("rank 0: accepting a rank failed ({e})")),
        };
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        // Something else knocked on the port (a scanner, a stale client): ignore it.
        let Some((version, rank, world)) = read_hello(&mut stream) else {
            continue;
        };
        if let Err(why) = admit(spec, &peers, from, version, rank, world) {
            let _ = stream.write_all(&[1]);
            let _ = write_blob(&mut stream, why.as_bytes());
            return err(why);
        }
        peers.push((rank, stream));
    }
    for (rank, stream) in &mut peers {
        let sent = stream
            .write_all(&[0])
            .and_then(|()| write_blob(stream, &payload));
        if let Err(e) = sent {
            return err(format!(
                "rank 0 could not send the run's id to rank {rank} ({e})"
            ));
        }
    }
    peers.sort_by_key(|(r, _)| *r);
    let link = watch(0, peers)?;
    Ok((payload, link))
}

/// A joining rank's version, rank and world size; `None` for anything that is not a Framesmith rank.
fn read_hello(stream: &mut TcpStream) -> Option<(u32, usize, usize)> {
    let mut magic = [0u8; 4];
    stream.read_exact(&mut magic).ok()?;
    if &magic != MAGIC {
        return None;
    }
    let version = read_u32(stream).ok()?;
    let rank = read_u32(stream).ok()? as usize;
    let world = read_u32(stream).ok()? as usize;
    Some((version, rank, world))
}

/// Why rank 0 refuses a joining rank, if it does.
fn admit(
    spec: &RendezvousSpec,
    peers: &[(usize, TcpStream)],
    from: SocketAddr,
    version: u32,
    rank: usize,
    world: usize,
) -> std::result::Result<(), String> {
    if version != VERSION {
        return Err(format!(
            "a rank from {from} speaks rendezvous version {version} and rank 0 version {VERSION}: run the same \
             framesmith build on every machine"
        ));
    }
    if world != spec.world {
        return Err(format!(
            "rank {rank} (from {from}) was started with a world size of {world} and rank 0 with {}: start every \
             rank with the same --world-size",
            spec.world
        ));
    }
    if rank >= world {
        return Err(format!(
            "a process from {from} joined as rank {rank}, which a world of {world} does not have: ranks go from 0 \
             to {}",
            world - 1
        ));
    }
    if rank == 0 || peers.iter().any(|(p, _)| *p == rank) {
        return Err(format!(
            "two processes joined as rank {rank} (the second from {from}): give every process its own --rank \
             from 0 to {}",
            world - 1
        ));
    }
    Ok(())
}

fn join(spec: &RendezvousSpec) -> Result<(Vec<u8>, Link)> {
    let addrs = resolve(spec)?;
    let deadline = Instant::now() + spec.timeout;
    let mut last_error = String::new();
    let mut stream = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return err(format!(
                "rank {} could not reach rank 0 at {}:{} within {:.0?} ({last_error}): start rank 0, and check \
                 --master-addr / --master-port (MASTER_ADDR / MASTER_PORT) and that the port is open",
                spec.rank, spec.addr, spec.port, spec.timeout
            ));
        }
        let attempt = addrs.iter().find_map(|a| {
            TcpStream::connect_timeout(a, left.min(Duration::from_secs(2)))
                .map_err(|e| last_error = e.to_string())
                .ok()
        });
        match attempt {
            Some(s) => break s,
            None => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    let io = |e: std::io::Error| {
        RendezvousError(format!(
            "rank {}: the rendezvous with rank 0 at {}:{} failed ({e}); rank 0 may have stopped or refused the run",
            spec.rank, spec.addr, spec.port
        ))
    };
    stream.write_all(MAGIC).map_err(io)?;
    for v in [VERSION, spec.rank as u32, spec.world as u32] {
        write_u32(&mut stream, v).map_err(io)?;
    }
    stream.flush().map_err(io)?;
    let left = deadline.saturating_duration_since(Instant::now());
    stream
        .set_read_timeout(Some(left.max(Duration::from_secs(1))))
        .map_err(io)?;
    let mut status = [0u8; 1];
    stream.read_exact(&mut status).map_err(|e| {
        RendezvousError(format!(
            "rank {}: rank 0 at {}:{} did not send the run's id in time ({e}): all {} ranks must be started",
            spec.rank, spec.addr, spec.port, spec.world
        ))
    })?;
    let body = read_blob(&mut stream).map_err(io)?;
    if status[0] != 0 {
        return err(format!(
            "rank 0 refused rank {}: {}",
            spec.rank,
            String::from_utf8_lossy(&body)
        ));
    }
    let link = watch(spec.rank, vec![(0, stream)])?;
    Ok((body, link))
}

/// Starts one watcher thread per connection. Rank 0 tells every other rank when one is lost.
fn watch(rank: usize, peers: Vec<(usize, TcpStream)>) -> Result<Link> {
    let state = Arc::new(LinkState::default());
    let announce: Vec<(usize, TcpStream)> = if rank == 0 {
        peers
            .iter()
            .filter_map(|(r, s)| s.try_clone().ok().map(|s| (*r, s)))
            .collect()
    } else {
        Vec::new()
    };
    let announce = Arc::new(Mutex::new(announce));
    for (peer, stream) in &peers {
        let mut reader = stream
            .try_clone()
            .map_err(|e| RendezvousError(format!("rank {rank}: cannot watch rank {peer} ({e})")))?;
        let _ = reader.set_read_timeout(None);
        let (peer, state, announce) = (*peer, state.clone(), announce.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("framesmith-rank-{peer}-watch"))
            .spawn(move || {
                let mut byte = [0u8; 1];
                let why = match reader.read(&mut byte) {
                    Ok(1) if byte[0] == BYE => format!("rank {peer} left the run (it finished, stopped or failed)"),
                    Ok(1) if byte[0] == ABORT => match read_blob(&mut reader) {
                        Ok(m) => String::from_utf8_lossy(&m).into_owned(),
                        Err(_) => "rank 0 stopped the run".to_string(),
                    },
                    Ok(_) => format!("rank {peer} closed its connection without a goodbye: it stopped or crashed"),
                    Err(e) => format!("the connection to rank {peer} broke ({e}): it stopped or crashed"),
                };
                if rank == 0 {
                    if let Ok(mut others) = announce.lock() {
                        for (_, s) in others.iter_mut().filter(|(r, _)| *r != peer) {
                            let _ = s.write_all(&[ABORT]).and_then(|()| write_blob(s, why.as_bytes()));
                        }
                    }
                }
                state.lose(why);
            });
        if let Err(e) = spawned {
            return err(format!("rank {rank}: cannot start a watcher thread ({e})"));
        }
    }
    Ok(Link { rank, peers, state })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap()
    }

    fn spec(rank: usize, world: usize, port: u16, secs: u64) -> RendezvousSpec {
        RendezvousSpec {
            rank,
            world,
            addr: "127.0.0.1".into(),
            port,
            timeout: Duration::from_secs(secs),
        }
    }

    fn wait_for(link: &Link, secs: u64) -> Option<String> {
        let until = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < until {
            if let Some(why) = link.lost() {
                return Some(why);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    #[test]
    fn every_rank_gets_rank_0s_payload_whatever_the_start_order() {
        let port = free_port();
        let world = 4;
        // The other ranks start first: they retry until rank 0 listens.
        let others: Vec<_> = (1..world)
            .map(|r| {
                std::thread::spawn(move || rendezvous(&spec(r, world, port, 20), || Ok(vec![])))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let (id, root) = rendezvous(&spec(0, world, port, 20), || Ok(b"the id".to_vec())).unwrap();
        assert_eq!(id, b"the id");
        let links: Vec<Link> = others
            .into_iter()
            .map(|h| {
                let (got, link) = h.join().unwrap().unwrap();
                assert_eq!(got, b"the id");
                link
            })
            .collect();
        // Nothing is reported while every rank is there; a rank that leaves is reported.
        assert_eq!(wait_for(&root, 1), None);
        assert!(links.iter().all(|l| l.lost().is_none()));
        let mut links = links;
        drop(links.remove(0));
        let why = wait_for(&root, 5).expect("rank 0 learns that rank 1 left");
        assert!(why.contains("rank 1 left the run"), "{why}");
        let why = wait_for(&links[0], 5).expect("rank 2 hears it from rank 0");
        assert!(why.contains("rank 1 left the run"), "{why}");
    }

    #[test]
    fn a_rank_that_dies_is_reported_to_every_other_rank() {
        let port = free_port();
        let handles: Vec<_> = (1..3)
            .map(|r| std::thread::spawn(move || rendezvous(&spec(r, 3, port, 20), || Ok(vec![]))))
            .collect();
        let (_, root) = rendezvous(&spec(0, 3, port, 20), || Ok(vec![7])).unwrap();
        let mut links: Vec<Link> = handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap().1)
            .collect();
        let survivor = links.pop().unwrap();
        let dead = links.pop().unwrap();
        // A crash: the socket closes with no goodbye.
        for (_, s) in &dead.peers {
            s.shutdown(std::net::Shutdown::Both).unwrap();
        }
        std::mem::forget(dead);
        let at_root = wait_for(&root, 5).expect("rank 0 notices");
        assert!(at_root.contains("rank 1"), "{at_root}");
        let at_survivor = wait_for(&survivor, 5).expect("rank 2 hears from rank 0");
        assert!(at_survivor.contains("rank 1"), "{at_survivor}");
        let heard = Arc::new(Mutex::new(None));
        let slot = heard.clone();
        survivor.on_lost(Box::new(move |why| {
            *slot.lock().unwrap() = Some(why.to_string())
        }));
        assert!(heard.lock().unwrap().is_some());
    }

    #[test]
    fn wrong_world_sizes_and_absent_ranks_fail_with_the_address() {
        let port = free_port();
        let stray = std::thread::spawn(move || rendezvous(&spec(1, 3, port, 10), || Ok(vec![])));
        let e = rendezvous(&spec(0, 2, port, 10), || Ok(vec![]))
            .err()
            .unwrap()
            .0;
        assert!(
            e.contains("world size of 3") && e.contains("same --world-size"),
            "{e}"
        );
        let e = stray.join().unwrap().err().unwrap().0;
        assert!(e.contains("refused") || e.contains("failed"), "{e}");

        let port = free_port();
        let started = Instant::now();
        let e = rendezvous(
            &RendezvousSpec {
                timeout: Duration::from_millis(400),
                ..spec(1, 2, port, 0)
            },
            || Ok(vec![]),
        )
        .err()
        .unwrap()
        .0;
        assert!(
            e.contains(&format!("127.0.0.1:{port}")) && e.contains("start rank 0"),
            "{e}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));

        let e = rendezvous(
            &RendezvousSpec {
                timeout: Duration::from_millis(300),
                ..spec(0, 3, free_port(), 0)
            },
            || Ok(vec![]),
        )
        .err()
        .unwrap()
        .0;
        assert!(e.contains("rank(s) 1, 2 never joined"), "{e}");
        let e = rendezvous(&spec(3, 3, port, 1), || Ok(vec![]))
            .err()
            .unwrap()
            .0;
        assert!(e.contains("does not exist"), "{e}");
    }
}
