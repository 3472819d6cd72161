//! Turns what ffmpeg / ffprobe print on stderr into a one-line reason a user can read: no `[mov,mp4 @ 0x…]`
//! context tags, no repeated file path (messages put the path last themselves), no duplicate lines.

use std::path::Path;

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
    // ffmpeg says the cause first and its consequence last; what comes between repeats the cause.
    match lines.as_slice() {
        [] => "no error message".into(),
        [only] => only.clone(),
        [first, .., last] => format!("{first}; {last}"),
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
    fn repeated_lines_count_once_and_the_first_and_last_stay() {
        let path = Path::new("v.mp4");
        let stderr = b"[h264 @ 0x1] Invalid NAL unit size (1515870810 > 1373).\n\
                       [h264 @ 0x2] Invalid NAL unit size (1515870810 > 1373).\n\
                       [h264 @ 0x2] Error splitting the input into NAL units.\n\
                       [vist#0:0/h264 @ 0x4] Decoding error: Invalid data found when processing input\n\
                       Cannot determine format of input stream 0:0 after EOF\n";
        let reason = one_line_reason(stderr, path);
        assert_eq!(
            reason,
            "Invalid NAL unit size (1515870810 > 1373); Cannot determine format of input stream 0:0 after EOF"
        );
        assert!(!reason.contains("0x") && !reason.contains('\n'), "{reason}");
        assert_eq!(one_line_reason(b"\n  \n", path), "no error message");
    }
}
