//! Sample prompt files in musubi-tuner's syntax: one prompt per line with options `--w` width, `--h` height,
//! `--f` frames, `--d` seed, `--s` steps, `--l` guidance scale, `--fs` flow shift, `--n` negative prompt, `--i`
//! start image, `--ci` an edit model's control image (repeatable; relative paths are read from the prompt file's
//! folder); `#` starts a comment line. A `.toml` file holds `[[prompt]]` tables with the same fields spelled out.

use std::path::{Path, PathBuf};

use framesmith_config::file_read::{excerpt, read_string_bounded, ReadLimit};
use framesmith_config::validate::{MAX_FRAMES, MAX_SIDE_PIXELS};
use serde::Deserialize;

/// Frames of a sample clip without `--f`.
pub const DEFAULT_FRAMES: usize = 81;
/// Classifier-free guidance of a sample clip without `--l`.
pub const DEFAULT_CLIP_GUIDANCE: f64 = 5.0;
/// Flow shift of a sample clip without `--fs`.
pub const DEFAULT_FLOW_SHIFT: f64 = 5.0;

/// One sample to generate. The options whose default depends on the model (a frame count and a flow shift mean
/// nothing to an image model; the guidance scale differs) stay `None` when the line does not give them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PromptSpec {
    pub prompt: String,
    pub negative: Option<String>,
    pub width: usize,
    pub height: usize,
    pub frames: Option<usize>,
    pub seed: u64,
    pub steps: usize,
    pub guidance: Option<f64>,
    pub flow_shift: Option<f64>,
    /// The start image of an image-to-video sample (`--i`).
    pub image: Option<PathBuf>,
    /// The images an edit model's sample edits (`--ci`, repeatable, in order); `controls` in a TOML file.
    pub controls: Vec<PathBuf>,
}

impl Default for PromptSpec {
    fn default() -> Self {
        Self {
            prompt: String::new(),
            negative: None,
            width: 832,
            height: 480,
            frames: None,
            seed: 42,
            steps: 20,
            guidance: None,
            flow_shift: None,
            image: None,
            controls: Vec::new(),
        }
    }
}

impl PromptSpec {
    /// Frames of the clip (`--f`, else [`DEFAULT_FRAMES`]).
    pub fn clip_frames(&self) -> usize {
        self.frames.unwrap_or(DEFAULT_FRAMES)
    }

    /// Guidance scale of a clip (`--l`, else [`DEFAULT_CLIP_GUIDANCE`]).
    pub fn clip_guidance(&self) -> f64 {
        self.guidance.unwrap_or(DEFAULT_CLIP_GUIDANCE)
    }

    /// Refuses what no sample can be made of: 0 steps, and a frame count that is not 4k+1 (a video VAE packs 4
    /// frames per latent after the first; another count would silently become a shorter clip), naming the option
    /// and the counts nearest to it.
    pub fn check(&self) -> Result<(), String> {
        if self.steps == 0 {
            return Err("--s 0: a sample needs at least 1 denoising step; use e.g. --s 20".into());
        }
        for (flag, side) in [("--w", self.width), ("--h", self.height)] {
            if side == 0 || side > MAX_SIDE_PIXELS {
                return Err(format!(
                    "{flag} {side}: a sample's side is 1 to {MAX_SIDE_PIXELS} pixels; use e.g. --w 832 --h 480"
                ));
            }
        }
        if let Some(frames) = self.frames.filter(|&f| f > MAX_FRAMES) {
            return Err(format!(
                "--f {frames}: a sample clip has at most {MAX_FRAMES} frames; use e.g. --f 81"
            ));
        }
        match self.frames {
            Some(frames) if frames % 4 != 1 => {
                let down = frames.saturating_sub(1) / 4 * 4 + 1;
                let nearest = if frames == 0 {
                    "1".to_string()
                } else {
                    format!("{down} or {}", down + 4)
                };
                Err(format!(
                    "--f {frames} is not 4k+1 frames (the VAE packs 4 frames per latent after the first): use \
                     {nearest}"
                ))
            }
            _ => Ok(()),
        }
    }

    /// Flow shift of a clip (`--fs`, else [`DEFAULT_FLOW_SHIFT`]).
    pub fn clip_flow_shift(&self) -> f64 {
        self.flow_shift.unwrap_or(DEFAULT_FLOW_SHIFT)
    }
}

/// A prompt-file problem, naming the line.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error("cannot read the prompt file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Line {
        path: String,
        line: usize,
        message: String,
    },
    #[error("{path}: {message}")]
    Toml { path: String, message: String },
    #[error(
        "the prompt file has no prompts (only blank lines and # comments): write one prompt per line, e.g. \
         `a red fox runs through snow --w 832 --h 480 --f 33`: {path}"
    )]
    Empty { path: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlPrompts {
    prompt: Vec<PromptSpec>,
}

/// Reads a `.txt` or `.toml` prompt file; a file without a prompt is an error.
pub fn read_prompt_file(path: &Path) -> Result<Vec<PromptSpec>, PromptError> {
    let prompts = read_prompts(path)?;
    if prompts.is_empty() {
        return Err(PromptError::Empty {
            path: path.display().to_string(),
        });
    }
    Ok(prompts)
}

fn read_prompts(path: &Path) -> Result<Vec<PromptSpec>, PromptError> {
    let shown = path.display().to_string();
    let text = read_string_bounded(path, ReadLimit::PROMPTS).map_err(|source| PromptError::Io {
        path: shown.clone(),
        source,
    })?;
    let folder = path.parent().unwrap_or(Path::new(""));
    let beside_file = |mut spec: PromptSpec| {
        spec.image = spec.image.map(|image| folder.join(image));
        spec.controls = spec.controls.iter().map(|c| folder.join(c)).collect();
        spec
    };
    if path.extension().and_then(|e| e.to_str()) == Some("toml") {
        let prompts = toml::from_str::<TomlPrompts>(&text)
            .map_err(|e| PromptError::Toml {
                path: shown.clone(),
                message: toml_message(&e, &text),
            })?
            .prompt;
        return prompts
            .into_iter()
            .enumerate()
            .map(|(i, spec)| {
                spec.check()
                    .map(|()| beside_file(spec))
                    .map_err(|message| PromptError::Toml {
                        path: shown.clone(),
                        message: format!("[[prompt]] {}: {message}", i + 1),
                    })
            })
            .collect();
    }
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(|(i, l)| {
            parse_line(l)
                .and_then(|spec| spec.check().map(|()| spec))
                .map(beside_file)
                .map_err(|message| PromptError::Line {
                    path: shown.clone(),
                    line: i + 1,
                    message: excerpt(&message, MAX_QUOTED_CHARS).into_owned(),
                })
        })
        .collect()
}

/// Longest message quoted from a prompt file into an error (a damaged file can hold one endless line).
const MAX_QUOTED_CHARS: usize = 300;

/// toml's message with its line and column, without the quoted source line toml's display adds (which in a
/// damaged file can be megabytes).
fn toml_message(err: &toml::de::Error, text: &str) -> String {
    let at = framesmith_config::error::location_of(text, err.span().map_or(0, |s| s.start));
    format!(
        "{} at {at}",
        excerpt(err.message().trim(), MAX_QUOTED_CHARS)
    )
}

/// Parses one line: the prompt text, then ` --key value` options.
pub fn parse_line(line: &str) -> Result<PromptSpec, String> {
    let mut parts = line.split(" --");
    let mut spec = PromptSpec {
        prompt: parts.next().unwrap_or_default().trim().to_string(),
        ..PromptSpec::default()
    };
    for part in parts {
        let (key, value) = part
            .trim()
            .split_once(char::is_whitespace)
            .unwrap_or((part.trim(), ""));
        let value = value.trim();
        let number = |what: &str| format!("--{key} needs {what}, got `{value}`");
        match key {
            "w" => spec.width = value.parse().map_err(|_| number("a width in pixels"))?,
            "h" => spec.height = value.parse().map_err(|_| number("a height in pixels"))?,
            "f" => spec.frames = Some(value.parse().map_err(|_| number("a frame count"))?),
            "d" => spec.seed = value.parse().map_err(|_| number("an integer seed"))?,
            "s" => spec.steps = value.parse().map_err(|_| number("a step count"))?,
            "l" => spec.guidance = Some(value.parse().map_err(|_| number("a guidance scale"))?),
            "fs" => spec.flow_shift = Some(value.parse().map_err(|_| number("a flow shift"))?),
            "n" => spec.negative = Some(value.to_string()),
            "i" => spec.image = Some(PathBuf::from(value)),
            "ci" => spec.controls.push(PathBuf::from(value)),
            other => {
                return Err(format!(
                    "unknown option --{other} (known: --w --h --f --d --s --l --fs --n --i --ci)"
                ))
            }
        }
    }
    if spec.prompt.is_empty() {
        return Err("the line has options but no prompt text".into());
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_musubi_lines() {
        let spec = parse_line("a cat walking --w 512 --h 320 --f 33 --d 7 --s 25 --l 6.5 --fs 3 --n blurry, low quality")
            .expect("valid line");
        assert_eq!(spec.prompt, "a cat walking");
        assert_eq!(
            (spec.width, spec.height, spec.clip_frames()),
            (512, 320, 33)
        );
        assert_eq!((spec.seed, spec.steps), (7, 25));
        assert_eq!((spec.guidance, spec.flow_shift), (Some(6.5), Some(3.0)));
        let plain = parse_line("a cat").expect("valid line");
        assert_eq!(
            (plain.frames, plain.guidance, plain.flow_shift),
            (None, None, None)
        );
        assert_eq!(
            (
                plain.clip_frames(),
                plain.clip_guidance(),
                plain.clip_flow_shift()
            ),
            (DEFAULT_FRAMES, DEFAULT_CLIP_GUIDANCE, DEFAULT_FLOW_SHIFT)
        );
        assert_eq!(spec.negative.as_deref(), Some("blurry, low quality"));
    }

    #[test]
    fn bad_lines_name_the_problem() {
        assert!(parse_line("x --w wide").unwrap_err().contains("--w"));
        assert!(parse_line("x --zz 1")
            .unwrap_err()
            .contains("unknown option --zz"));
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.txt");
        std::fs::write(&path, "# comment\nok prompt\nbad --s x\n").expect("write");
        let err = read_prompt_file(&path).unwrap_err().to_string();
        assert!(err.contains("p.txt:3"), "{err}");
    }

    #[test]
    fn hostile_prompt_files_are_refused_at_once_with_short_messages() {
        let dir = tempfile::tempdir().expect("tempdir");
        let huge = dir.path().join("huge.txt");
        std::fs::File::create(&huge)
            .and_then(|f| f.set_len(3 << 30))
            .expect("sparse file");
        let err = read_prompt_file(&huge).unwrap_err().to_string();
        assert!(
            err.contains("over the 16 MiB limit for a prompt file"),
            "{err}"
        );
        #[cfg(unix)]
        {
            let err = read_prompt_file(Path::new("/dev/zero"))
                .unwrap_err()
                .to_string();
            assert!(err.contains("character device, not a file"), "{err}");
        }
        // One endless line of a damaged TOML prompt file is not quoted back whole.
        let zeros = dir.path().join("zeros.toml");
        std::fs::write(&zeros, vec![0u8; 1 << 20]).expect("write");
        let err = read_prompt_file(&zeros).unwrap_err().to_string();
        assert!(err.len() < 1000, "{} bytes", err.len());
        let long = dir.path().join("long.txt");
        std::fs::write(&long, format!("x --{} 1\n", "z".repeat(1 << 20))).expect("write");
        let err = read_prompt_file(&long).unwrap_err().to_string();
        assert!(err.len() < 1000, "{} bytes", err.len());
    }

    #[test]
    fn absurd_sizes_and_files_without_prompts_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.txt");
        let error = |text: &str| {
            std::fs::write(&path, text).expect("write");
            read_prompt_file(&path).unwrap_err().to_string()
        };
        let err = error("a cat --w 100000000\n");
        assert!(
            err.contains("--w 100000000") && err.contains("p.txt:1"),
            "{err}"
        );
        assert!(error("a cat --h 0\n").contains("--h 0"));
        assert!(error("a cat --f 100001\n").contains("at most 4093 frames"));
        for empty in ["", "\n\n", "# only a comment\n"] {
            let err = error(empty);
            assert!(
                err.contains("has no prompts") && err.contains("p.txt"),
                "{err}"
            );
        }
        let toml = dir.path().join("p.toml");
        std::fs::write(&toml, "prompt = []\n").expect("write");
        let err = read_prompt_file(&toml).unwrap_err().to_string();
        assert!(err.contains("has no prompts"), "{err}");
        std::fs::write(&path, "a cat --w 16384 --h 16 --f 4093\n").expect("write");
        assert_eq!(read_prompt_file(&path).expect("valid").len(), 1);
    }

    #[test]
    fn frame_counts_off_4k_plus_1_and_zero_steps_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.txt");
        let error = |line: &str| {
            std::fs::write(&path, line).expect("write");
            read_prompt_file(&path).unwrap_err().to_string()
        };
        let err = error("a cat --f 6\n");
        assert!(
            err.contains("--f 6 is not 4k+1")
                && err.contains("use 5 or 9")
                && err.contains("p.txt:1"),
            "{err}"
        );
        assert!(error("a cat --f 0\n").contains("use 1"));
        let err = error("ok --f 5\na cat --s 0\n");
        assert!(err.contains("p.txt:2") && err.contains("--s 0"), "{err}");
        let toml = dir.path().join("p.toml");
        std::fs::write(
            &toml,
            "[[prompt]]\nprompt = \"a\"\n[[prompt]]\nprompt = \"b\"\nframes = 8\n",
        )
        .expect("write");
        let err = read_prompt_file(&toml).unwrap_err().to_string();
        assert!(
            err.contains("[[prompt]] 2") && err.contains("--f 8"),
            "{err}"
        );
        std::fs::write(&path, "a cat --f 9 --s 1\n").expect("write");
        assert_eq!(read_prompt_file(&path).expect("valid")[0].clip_frames(), 9);
    }

    #[test]
    fn start_images_are_read_beside_the_prompt_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.txt");
        std::fs::write(&path, "a dot --i start.png\nno image\n").expect("write");
        let specs = read_prompt_file(&path).expect("valid file");
        assert_eq!(specs[0].prompt, "a dot");
        assert_eq!(specs[0].image, Some(dir.path().join("start.png")));
        assert_eq!(specs[1].image, None);
        let path = dir.path().join("edit.txt");
        std::fs::write(&path, "make it red --ci a.png --ci b.png\n").expect("write");
        let specs = read_prompt_file(&path).expect("valid file");
        assert_eq!(
            specs[0].controls,
            [dir.path().join("a.png"), dir.path().join("b.png")]
        );
    }
}
