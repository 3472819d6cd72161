//! Turns what ffmpeg / ffprobe print on stderr into a one-line reason a user can read: no `[mov,mp4 @ 0x…]`
//! context tags, no repeated file path (messages put the path last themselves), no duplicate lines.

use std::path::Path;

/// Most distinct lines kept: ffmpeg says the cause first and its consequence last.
const KEPT_LINES: usize = 2;

/// One line saying why the tool failed on `path`, from its stderr.
pub(crate) fn one_line_reason(stderr: &[u8], path: &Path) -> String {
    let text = String::from_utf8_lossy(stderr);
    let shown = path.display().to_string();
    let mut lines: Vec<String> = Vec::new();
    for raw in text.lines() {
        let line = clean_line(raw, &shown);
        if !line.is_empty() && !lines.iter().any(|l| l.eq_ignore_ascii_case(&line)) {
            lines.push(line);
        }
    }
    let tail = &lines[lines.len().saturating_sub(KEPT_LINES)..];
    if tail.is_empty() {
        "no error message".into()
    } else {
        tail.join("; ")
    }
}

/// One stderr line without its `[demuxer @ 0x…]` tags and without a leading `<path>: `.
fn clean_line(raw: &str, path: &str) -> String {
    let mut line = raw.trim();
    while let Some(rest) = line.strip_prefix('[') {
        match rest.split_once(']') {
            Some((tag, after)) if tag.contains(" @ ") || !tag.contains(' ') => line = after.trim(),
            _ => break,
        }
    }
    if let Some(rest) = line.strip_prefix(path) {
        line = rest.trim_start_matches(':').trim();
    }
    line.trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demuxer_tags_and_the_path_are_removed() {
        let path = Path::new("/data/clips/broken.mp4");
        let stderr = b"[mov,mp4,m4a,3gp,3g2,mj2 @ 0x55d0c7a3c2c0] moov atom not found\n\
                       /data/clips/broken.mp4: Invalid data found when processing input\n";
        assert_eq!(
            one_line_reason(stderr, path),
            "moov atom not found; Invalid data found when processing input"
        );
    }

    #[test]
    fn repeated_lines_count_once_and_only_the_last_two_stay() {
        let path = Path::new("v.mkv");
        let stderr = b"[h264 @ 0x1] error while decoding MB 3 4\n[h264 @ 0x2] error while decoding MB 3 4\n\
                       [matroska,webm @ 0x3] EBML header parsing failed\nv.mkv: Invalid data found when processing input\n";
        let reason = one_line_reason(stderr, path);
        assert_eq!(
            reason,
            "EBML header parsing failed; Invalid data found when processing input"
        );
        assert!(!reason.contains("0x") && !reason.contains('\n'), "{reason}");
        assert_eq!(one_line_reason(b"\n  \n", path), "no error message");
    }
}
