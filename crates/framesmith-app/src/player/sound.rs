//! A sample clip's sound: whether its MP4 has an audio stream (ffprobe, off the UI thread), and the sound played
//! by an `ffplay -nodisp` child in step with the frames ([`SoundSync`] decides when). The child is killed when
//! the sound stops, another clip opens, the player closes or the app exits; it never outlives the player.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use egui::{RichText, Ui};
use framesmith_config::tools::find_tool;

use super::sync::{SoundAction, SoundSync, SyncInput};
use super::PlayerClock;
use crate::theme;

/// How long ffprobe may take to say whether a clip has sound.
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);
/// The stderr kept from ffplay, for the reason it gives when it cannot play.
const STDERR_LIMIT_BYTES: u64 = 16 * 1024;
/// Sound shorter than this is not started (the frames are at their end).
const MIN_SPAN_SECS: f64 = 0.05;

/// The ffmpeg tools the sound needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SoundTools {
    pub ffprobe: Option<PathBuf>,
    pub ffplay: Option<PathBuf>,
}

impl SoundTools {
    /// The tools beside the running executable, else on `PATH` (where the dataset reader finds ffmpeg).
    pub fn locate() -> Self {
        Self {
            ffprobe: find_tool("ffprobe"),
            ffplay: find_tool("ffplay"),
        }
    }
}

/// A child process without a console window (from the app on Windows, each would flash one).
fn quiet(cmd: &mut Command) {
    cmd.stdin(Stdio::null());
    #[cfg(windows)]
    {
        use std::os::windows::process::CommandExt;
        // CREATE_NO_WINDOW
        cmd.creation_flags(0x0800_0000);
    }
}

/// Reads a child's pipe to its end on its own thread, so that the pipe never fills up and blocks the child.
fn read_pipe(pipe: Option<impl Read + Send + 'static>) -> Option<JoinHandle<Vec<u8>>> {
    let mut pipe = pipe?;
    std::thread::Builder::new()
        .name("sound tool output".into())
        .spawn(move || {
            let mut kept = Vec::new();
            let _ = (&mut pipe).take(STDERR_LIMIT_BYTES).read_to_end(&mut kept);
            let _ = std::io::copy(&mut pipe, &mut std::io::sink());
            kept
        })
        .ok()
}

/// Whether `clip` has an audio stream, asked of ffprobe (blocking: call it off the UI thread).
pub fn probe_sound(ffprobe: &Path, clip: &Path) -> Result<bool, String> {
    let mut cmd = Command::new(ffprobe);
    cmd.args(["-v", "error", "-select_streams", "a"])
        .args(["-show_entries", "stream=index", "-of", "csv=p=0"])
        .arg(clip)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    quiet(&mut cmd);
    let mut child = cmd
        .spawn()
        .map_err(|err| format!("cannot run ffprobe ({err}): {}", ffprobe.display()))?;
    let stderr = read_pipe(child.stderr.take());
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let stdout = child.stdout.take();
    let reader = std::thread::Builder::new()
        .name("sound probe output".into())
        .spawn(move || {
            let mut out = Vec::new();
            if let Some(mut stdout) = stdout {
                let _ = stdout.read_to_end(&mut out);
            }
            let _ = tx.send(out);
        });
    let out = match reader.map(|_| rx.recv_timeout(PROBE_TIMEOUT)) {
        Ok(Ok(out)) => out,
        Ok(Err(RecvTimeoutError::Timeout)) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "ffprobe did not answer within {} s: {}",
                PROBE_TIMEOUT.as_secs(),
                clip.display()
            ));
        }
        Ok(Err(RecvTimeoutError::Disconnected)) | Err(_) => Vec::new(),
    };
    let status = child
        .wait()
        .map_err(|err| format!("ffprobe failed ({err}): {}", clip.display()))?;
    if !status.success() {
        let stderr = stderr.and_then(|h| h.join().ok()).unwrap_or_default();
        let reason = first_reason(&String::from_utf8_lossy(&stderr))
            .unwrap_or_else(|| format!("ffprobe exited with {status}"));
        return Err(format!("{reason}: {}", clip.display()));
    }
    Ok(!String::from_utf8_lossy(&out).trim().is_empty())
}

/// The first line of a tool's stderr that says something: not ALSA's device-probing noise.
fn first_reason(stderr: &str) -> Option<String> {
    stderr
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with("ALSA lib"))
        .map(str::to_owned)
}

/// The ffplay command that plays `for_secs` of `clip`'s sound from `from_secs`, without a window.
pub fn ffplay_command(ffplay: &Path, clip: &Path, from_secs: f64, for_secs: f64) -> Command {
    let mut cmd = Command::new(ffplay);
    cmd.args(["-nodisp", "-autoexit", "-loglevel", "error", "-vn", "-sn"])
        .arg("-ss")
        .arg(format!("{from_secs:.3}"))
        .arg("-t")
        .arg(format!("{for_secs:.3}"))
        .arg(clip);
    cmd
}

/// A running ffplay: killed (and waited for) when stopped or dropped.
pub struct Playback {
    child: Child,
    stderr: Option<JoinHandle<Vec<u8>>>,
}

impl Playback {
    pub fn spawn(mut cmd: Command) -> std::io::Result<Self> {
        cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        quiet(&mut cmd);
        let mut child = cmd.spawn()?;
        let stderr = read_pipe(child.stderr.take());
        Ok(Self { child, stderr })
    }

    /// `None` while it plays; once it has ended by itself, what it said on stderr (empty when nothing).
    pub fn ended(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(None) => None,
            Ok(Some(_)) | Err(_) => {
                let stderr = self.stderr.take().and_then(|h| h.join().ok());
                Some(String::from_utf8_lossy(&stderr.unwrap_or_default()).into_owned())
            }
        }
    }

    /// Kills the child and waits for it.
    pub fn stop(mut self) -> std::io::Result<ExitStatus> {
        self.kill_and_wait()
    }

    fn kill_and_wait(&mut self) -> std::io::Result<ExitStatus> {
        // Killing a child that has already exited fails harmlessly; `wait` then returns its status.
        let _ = self.child.kill();
        self.child.wait()
    }
}

impl Drop for Playback {
    fn drop(&mut self) {
        let _ = self.kill_and_wait();
    }
}

/// Whether a clip has sound: unknown until ffprobe answers.
enum Probe {
    /// No clip, or not a video (an image sample), or no ffprobe to ask.
    Unasked,
    Pending(Receiver<Result<bool, String>>),
    Answered(Result<bool, String>),
}

/// The open clip's sound: its probe, the mute setting, and the ffplay that plays it.
pub struct ClipSound {
    tools: SoundTools,
    repaint: Option<egui::Context>,
    clip: Option<PathBuf>,
    probe: Probe,
    muted: bool,
    /// Why ffplay could not play the open clip's sound (shown once, by the mute toggle).
    failure: Option<String>,
    sync: SoundSync,
    playback: Option<Playback>,
    epoch: Instant,
}

impl ClipSound {
    /// `tools` empty: every clip plays silently (the UI tests).
    pub fn new(tools: SoundTools, repaint: Option<egui::Context>) -> Self {
        Self {
            tools,
            repaint,
            clip: None,
            probe: Probe::Unasked,
            muted: false,
            failure: None,
            sync: SoundSync::default(),
            playback: None,
            epoch: Instant::now(),
        }
    }

    /// A clip opened: `file` is its MP4 (whose sound is probed) or its PNG image (which has none).
    pub fn open(&mut self, file: &Path) {
        self.stop();
        self.failure = None;
        self.clip = Some(file.to_path_buf());
        self.probe = match &self.tools.ffprobe {
            Some(ffprobe) if is_video(file) => {
                self.spawn_probe(ffprobe.clone(), file.to_path_buf())
            }
            _ => Probe::Unasked,
        };
    }

    fn spawn_probe(&self, ffprobe: PathBuf, clip: PathBuf) -> Probe {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let repaint = self.repaint.clone();
        let spawned = std::thread::Builder::new()
            .name("sound probe".into())
            .spawn(move || {
                // A clip whose MP4 is gone (only its frames are left) plays silently, without a note.
                let answer = if clip.is_file() {
                    probe_sound(&ffprobe, &clip)
                } else {
                    Ok(false)
                };
                let _ = tx.send(answer);
                if let Some(ctx) = repaint {
                    ctx.request_repaint();
                }
            });
        match spawned {
            Ok(_) => Probe::Pending(rx),
            Err(err) => Probe::Answered(Err(format!("cannot start the sound check ({err})"))),
        }
    }

    /// Stops the sound (the player closes, or the app exits).
    pub fn stop(&mut self) {
        self.sync.reset();
        self.kill_playback();
    }

    fn kill_playback(&mut self) {
        if let Some(playback) = self.playback.take() {
            // Its exit status says nothing more: it was killed.
            let _ = playback.stop();
        }
    }

    /// Whether the open clip has sound.
    pub fn has_sound(&self) -> bool {
        matches!(self.probe, Probe::Answered(Ok(true)))
    }

    pub fn muted(&self) -> bool {
        self.muted
    }

    pub fn set_muted(&mut self, muted: bool) {
        if muted != self.muted {
            // A retry: unmuting plays the sound again after ffplay failed.
            self.failure = None;
        }
        self.muted = muted;
    }

    /// Takes ffprobe's answer and ffplay's end, and starts or stops the sound as the clock calls for.
    pub fn logic(&mut self, clock: &PlayerClock) {
        if let Probe::Pending(rx) = &self.probe {
            match rx.try_recv() {
                Ok(answer) => self.probe = Probe::Answered(answer),
                Err(TryRecvError::Disconnected) => {
                    self.probe = Probe::Answered(Err("the sound check stopped".into()));
                }
                Err(TryRecvError::Empty) => {}
            }
        }
        if let Some(stderr) = self.playback.as_mut().and_then(Playback::ended) {
            // ffplay exits 0 even when it cannot open the audio device: what it printed says it failed.
            self.playback = None;
            self.failure = first_reason(&stderr);
        }
        let input = SyncInput {
            playing: clock.playing,
            audible: self.audible(),
            position_secs: clock.position_secs(),
            duration_secs: clock.duration_secs(),
            now_secs: self.epoch.elapsed().as_secs_f64(),
        };
        match self.sync.update(input) {
            Some(SoundAction::Stop) => self.kill_playback(),
            Some(SoundAction::Start {
                from_secs,
                for_secs,
            }) => self.start(from_secs, for_secs),
            None => {}
        }
    }

    fn audible(&self) -> bool {
        self.has_sound() && !self.muted && self.failure.is_none() && self.tools.ffplay.is_some()
    }

    fn start(&mut self, from_secs: f64, for_secs: f64) {
        self.kill_playback();
        let (Some(ffplay), Some(clip)) = (&self.tools.ffplay, &self.clip) else {
            return;
        };
        if for_secs < MIN_SPAN_SECS {
            return;
        }
        match Playback::spawn(ffplay_command(ffplay, clip, from_secs, for_secs)) {
            Ok(playback) => self.playback = Some(playback),
            Err(err) => {
                self.failure = Some(format!("cannot run ffplay ({err}): {}", ffplay.display()));
            }
        }
    }

    /// The sound controls beside the playback controls: that the clip has sound, and the mute toggle. Nothing
    /// for a clip without sound.
    pub fn controls_ui(&mut self, ui: &mut Ui) {
        if !self.has_sound() {
            return;
        }
        ui.label(RichText::new("Sound").color(theme::ACCENT))
            .on_hover_text("This clip has a sound track, played with its frames");
        let mut muted = self.muted;
        if ui.checkbox(&mut muted, "Mute").changed() {
            self.set_muted(muted);
        }
    }

    /// Why the open clip's sound does not play, under the controls; nothing when it plays or has none.
    pub fn note_ui(&self, ui: &mut Ui) {
        if let Some(note) = self.note() {
            ui.label(RichText::new(note).small().color(theme::WARNING));
        }
    }

    fn note(&self) -> Option<String> {
        if let Probe::Answered(Err(err)) = &self.probe {
            return Some(format!("Sound not checked: {err}"));
        }
        if !self.has_sound() {
            return None;
        }
        match (&self.tools.ffplay, &self.failure) {
            (None, _) => Some(
                "ffplay not found, so the frames play without sound (it comes with ffmpeg)"
                    .to_owned(),
            ),
            (Some(_), Some(failure)) => Some(format!("No sound: {failure}")),
            (Some(_), None) => None,
        }
    }

    /// Waits for ffprobe's answer (tests only: the UI never blocks on it).
    #[cfg(test)]
    fn wait_for_probe(&mut self) {
        if let Probe::Pending(rx) = &self.probe {
            let answer = rx
                .recv()
                .unwrap_or_else(|_| Err("the sound check stopped".into()));
            self.probe = Probe::Answered(answer);
        }
    }
}

/// Whether `file` is a video container that may carry sound (not an image sample's PNG).
fn is_video(file: &Path) -> bool {
    file.extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .is_some_and(|e| matches!(e.as_str(), "mp4" | "mov" | "mkv" | "webm"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ffplay_plays_the_span_without_a_window_and_reasons_skip_alsa_noise() {
        let cmd = ffplay_command(Path::new("ffplay"), Path::new("/s/clip.mp4"), 1.25, 2.0);
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args,
            [
                "-nodisp",
                "-autoexit",
                "-loglevel",
                "error",
                "-vn",
                "-sn",
                "-ss",
                "1.250",
                "-t",
                "2.000",
                "/s/clip.mp4"
            ]
        );
        let stderr = "ALSA lib pcm.c:2666:(snd_pcm_open_noupdate) Unknown PCM default\n\n\
                      No more combinations to try, audio open failed\nFailed to open file\n";
        assert_eq!(
            first_reason(stderr).as_deref(),
            Some("No more combinations to try, audio open failed")
        );
        assert_eq!(first_reason("ALSA lib x\n  \n"), None);
        assert!(is_video(Path::new("a/b.MP4")) && !is_video(Path::new("a/b.png")));
    }

    #[test]
    fn without_tools_a_clip_is_silent_and_nothing_runs() {
        let mut sound = ClipSound::new(SoundTools::default(), None);
        sound.open(Path::new("/nonexistent/clip.mp4"));
        let mut clock = PlayerClock::new(16, 16.0);
        clock.toggle_play();
        sound.logic(&clock);
        assert!(!sound.has_sound());
        assert!(sound.playback.is_none());
    }

    #[test]
    fn the_note_says_why_a_clip_with_sound_plays_silently() {
        let mut sound = ClipSound::new(SoundTools::default(), None);
        assert_eq!(sound.note(), None, "no clip");
        sound.probe = Probe::Answered(Ok(false));
        assert_eq!(sound.note(), None, "a silent clip needs no note");
        sound.probe = Probe::Answered(Ok(true));
        assert!(sound.note().is_some_and(|n| n.contains("ffplay not found")));
        sound.tools.ffplay = Some(PathBuf::from("/opt/ffplay"));
        assert_eq!(sound.note(), None, "it plays");
        sound.failure = Some("audio open failed".into());
        assert_eq!(sound.note().as_deref(), Some("No sound: audio open failed"));
        sound.set_muted(true);
        assert_eq!(sound.note(), None, "toggling mute tries again");
        sound.probe = Probe::Answered(Err("bad file: /s/x.mp4".into()));
        assert_eq!(
            sound.note().as_deref(),
            Some("Sound not checked: bad file: /s/x.mp4")
        );
    }

    /// A clip with a sine tone (and a silent one) made by ffmpeg's lavfi sources; `None` without ffmpeg.
    fn tone_clips(dir: &Path, secs: u32) -> Option<(PathBuf, PathBuf)> {
        let ffmpeg = find_tool("ffmpeg")?;
        let (tone, silent) = (dir.join("tone.mp4"), dir.join("silent.mp4"));
        let video = format!("color=c=red:s=32x32:r=16:d={secs}");
        let made = Command::new(&ffmpeg)
            .args([
                "-v", "error", "-y", "-f", "lavfi", "-i", &video, "-f", "lavfi", "-i",
            ])
            .arg(format!("sine=frequency=440:duration={secs}"))
            .args(["-ac", "2", "-c:v", "mpeg4", "-c:a", "aac", "-shortest"])
            .arg(&tone)
            .status()
            .ok()?
            .success()
            && Command::new(&ffmpeg)
                .args([
                    "-v", "error", "-y", "-f", "lavfi", "-i", &video, "-c:v", "mpeg4",
                ])
                .arg(&silent)
                .status()
                .ok()?
                .success();
        assert!(made, "ffmpeg could not make the test clips");
        Some((tone, silent))
    }

    #[test]
    fn a_tone_clip_is_probed_as_sound_and_its_ffplay_is_killed_on_stop() {
        let tools = SoundTools::locate();
        let dir = tempfile::tempdir().unwrap();
        let (Some(ffprobe), Some(ffplay), Some((tone, silent))) = (
            tools.ffprobe.clone(),
            tools.ffplay.clone(),
            tone_clips(dir.path(), 20),
        ) else {
            eprintln!("skipped: ffmpeg, ffprobe or ffplay not found");
            return;
        };
        assert_eq!(probe_sound(&ffprobe, &tone), Ok(true));
        assert_eq!(probe_sound(&ffprobe, &silent), Ok(false));
        let missing = probe_sound(&ffprobe, &dir.path().join("none.mp4")).unwrap_err();
        assert!(missing.ends_with("none.mp4"), "{missing}");

        // SDL's dummy driver plays in real time without an audio device, so ffplay runs until it is killed.
        let mut cmd = ffplay_command(&ffplay, &tone, 0.0, 20.0);
        cmd.env("SDL_AUDIODRIVER", "dummy");
        let mut playback = Playback::spawn(cmd).unwrap();
        assert_eq!(playback.ended(), None, "ffplay plays");
        let status = playback.stop().unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(status.signal(), Some(9), "ffplay was killed: {status}");
        }
        assert!(!status.success());

        // Dropped: killed and reaped too.
        let mut cmd = ffplay_command(&ffplay, &tone, 0.0, 20.0);
        cmd.env("SDL_AUDIODRIVER", "dummy");
        let playback = Playback::spawn(cmd).unwrap();
        let pid = playback.child.id();
        drop(playback);
        #[cfg(target_os = "linux")]
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "ffplay {pid} still runs"
        );
        let _ = pid;

        // The player's sound: probed, started by Play and stopped by Pause.
        let mut sound = ClipSound::new(tools, None);
        sound.open(&tone);
        sound.wait_for_probe();
        assert!(sound.has_sound());
        let mut clock = PlayerClock::new(320, 16.0);
        clock.toggle_play();
        sound.logic(&clock);
        let pid = sound
            .playback
            .as_ref()
            .map(|p| p.child.id())
            .expect("ffplay started");
        clock.toggle_play();
        sound.logic(&clock);
        assert!(sound.playback.is_none());
        #[cfg(target_os = "linux")]
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "ffplay {pid} still runs"
        );
        let _ = pid;
        sound.open(&silent);
        sound.wait_for_probe();
        assert!(!sound.has_sound());
    }
}
