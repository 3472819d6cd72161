//! When a clip's sound starts, stops and restarts, from the player's clock alone: plain logic, no processes and no
//! egui, so every case is a unit test. The frames are the master clock; the sound follows them.

/// How far the frames and the sound may drift apart before the sound restarts where the frames are: a seek while
/// playing, a loop back to the start, or a UI that stalled (the frame clock skips no frames, so it falls behind).
pub const MAX_DRIFT_SECS: f64 = 0.25;

/// What the player's clock and settings say, each UI frame.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SyncInput {
    /// The frames are playing.
    pub playing: bool,
    /// The clip has sound, it is not muted, and it can be played.
    pub audible: bool,
    /// Where the frames are, in seconds from the clip's start.
    pub position_secs: f64,
    /// How long the clip's frames last.
    pub duration_secs: f64,
    /// A monotonic clock, in seconds: how long the sound has played since it started.
    pub now_secs: f64,
}

/// What to do with the sound.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SoundAction {
    /// Play `for_secs` of sound from `from_secs`, replacing any sound that plays.
    Start { from_secs: f64, for_secs: f64 },
    /// Stop the sound that plays.
    Stop,
}

/// The sound started last: where in the clip, and when.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Segment {
    from_secs: f64,
    started_at_secs: f64,
}

/// Keeps a clip's sound in step with its frames.
#[derive(Debug, Default)]
pub struct SoundSync {
    segment: Option<Segment>,
}

impl SoundSync {
    /// The action this UI frame calls for, if any.
    pub fn update(&mut self, input: SyncInput) -> Option<SoundAction> {
        if !(input.playing && input.audible) {
            return self.segment.take().map(|_| SoundAction::Stop);
        }
        if let Some(segment) = self.segment {
            // Where the sound is now, had it played on undisturbed (it may have ended: then this runs past the clip's
            // end, and the loop back to the start restarts it).
            let heard_secs = segment.from_secs + (input.now_secs - segment.started_at_secs);
            if (input.position_secs - heard_secs).abs() <= MAX_DRIFT_SECS {
                return None;
            }
        }
        self.segment = Some(Segment {
            from_secs: input.position_secs,
            started_at_secs: input.now_secs,
        });
        Some(SoundAction::Start {
            from_secs: input.position_secs,
            for_secs: (input.duration_secs - input.position_secs).max(0.0),
        })
    }

    /// Forgets the sound (another clip opened, or the player closes): a `Stop` when one was playing.
    pub fn reset(&mut self) -> Option<SoundAction> {
        self.segment.take().map(|_| SoundAction::Stop)
    }
}

#[cfg(test)]
mod tests {
    use super::super::PlayerClock;
    use super::*;

    /// A clip of 32 frames at 16 fps (2 s), its sound audible, driven at 60 UI frames a second.
    struct Rig {
        clock: PlayerClock,
        sync: SoundSync,
        audible: bool,
        now_secs: f64,
    }

    impl Rig {
        fn new() -> Self {
            Self {
                clock: PlayerClock::new(32, 16.0),
                sync: SoundSync::default(),
                audible: true,
                now_secs: 0.0,
            }
        }

        fn input(&self) -> SyncInput {
            SyncInput {
                playing: self.clock.playing,
                audible: self.audible,
                position_secs: self.clock.position_secs(),
                duration_secs: self.clock.duration_secs(),
                now_secs: self.now_secs,
            }
        }

        fn update(&mut self) -> Option<SoundAction> {
            self.sync.update(self.input())
        }

        /// Runs `secs` of UI frames; the actions taken.
        fn run(&mut self, secs: f64) -> Vec<SoundAction> {
            let dt = 1.0 / 60.0;
            let mut actions = Vec::new();
            for _ in 0..(secs / dt).round() as usize {
                self.now_secs += dt;
                self.clock.advance(dt);
                actions.extend(self.update());
            }
            actions
        }
    }

    fn start_at(action: Option<SoundAction>) -> f64 {
        match action {
            Some(SoundAction::Start { from_secs, .. }) => from_secs,
            other => panic!("expected a start, got {other:?}"),
        }
    }

    #[test]
    fn sound_starts_with_play_at_the_position_and_stops_on_pause() {
        let mut rig = Rig::new();
        assert_eq!(rig.update(), None, "paused: no sound");
        rig.clock.seek(8);
        rig.clock.toggle_play();
        assert_eq!(
            rig.update(),
            Some(SoundAction::Start {
                from_secs: 0.5,
                for_secs: 1.5
            })
        );
        assert!(rig.run(1.0).is_empty(), "plays on undisturbed");
        rig.clock.toggle_play();
        assert_eq!(rig.update(), Some(SoundAction::Stop));
        assert_eq!(rig.update(), None, "stopped once");
        rig.now_secs += 5.0;
        rig.clock.toggle_play();
        let from = start_at(rig.update());
        assert!((from - 1.5).abs() < 0.07, "resumes where it paused: {from}");
    }

    #[test]
    fn sound_restarts_from_the_start_when_the_clip_loops() {
        let mut rig = Rig::new();
        rig.clock.toggle_play();
        rig.update();
        let actions = rig.run(3.0);
        assert_eq!(actions.len(), 1, "{actions:?}");
        assert!(start_at(actions.first().copied()) < 0.07, "{actions:?}");
    }

    #[test]
    fn sound_stops_when_a_clip_without_loop_ends() {
        let mut rig = Rig::new();
        rig.clock.looping = false;
        rig.clock.toggle_play();
        rig.update();
        assert_eq!(rig.run(3.0), [SoundAction::Stop]);
        assert!(!rig.clock.playing);
    }

    #[test]
    fn a_seek_or_a_stalled_ui_restarts_the_sound_where_the_frames_are() {
        let mut rig = Rig::new();
        rig.clock.toggle_play();
        rig.update();
        rig.run(0.2);
        rig.clock.seek(24);
        assert_eq!(start_at(rig.update()), 1.5);
        // The UI stalls for a second: the frame clock moves on by its longest step only.
        rig.now_secs += 1.0;
        rig.clock.advance(1.0);
        let from = start_at(rig.update());
        assert!((from - 1.6).abs() < 1e-9, "{from}");
        assert!(rig.run(0.1).is_empty());
    }

    #[test]
    fn mute_stops_the_sound_and_unmute_starts_it_where_the_frames_are() {
        let mut rig = Rig::new();
        rig.clock.toggle_play();
        rig.update();
        rig.audible = false;
        assert_eq!(rig.update(), Some(SoundAction::Stop));
        assert!(rig.run(0.5).is_empty(), "muted: silent");
        rig.audible = true;
        let from = start_at(rig.update());
        assert!((from - 0.5).abs() < 0.07, "{from}");
    }

    #[test]
    fn a_clip_without_sound_never_starts_and_reset_stops_what_plays() {
        let mut rig = Rig::new();
        rig.audible = false;
        rig.clock.toggle_play();
        assert!(rig.run(3.0).is_empty());
        assert_eq!(rig.sync.reset(), None);
        rig.audible = true;
        assert!(rig.update().is_some());
        assert_eq!(rig.sync.reset(), Some(SoundAction::Stop));
        assert!(
            rig.update().is_some(),
            "after a reset the sound starts again"
        );
    }
}
