//! `dataset check` refuses a `batch_size` no bucket can fill (a batch takes samples of one bucket), instead of
//! letting training silently use smaller batches.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use framesmith_data::report::check_path;
use framesmith_data::scan::ScanOptions;
use image::RgbImage;

fn check(batch_size: u32, num_repeats: u32) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("images")).unwrap();
    for i in 0..3 {
        RgbImage::new(32, 32)
            .save(d.join(format!("images/{i}.png")))
            .unwrap();
        std::fs::write(d.join(format!("images/{i}.txt")), "a square").unwrap();
    }
    let toml = d.join("dataset.toml");
    std::fs::write(
        &toml,
        format!(
            "[general]\nresolution = [32, 32]\ncaption_extension = \".txt\"\nbatch_size = {batch_size}\n\
             num_repeats = {num_repeats}\n[[datasets]]\nimage_directory = \"images\"\n"
        ),
    )
    .unwrap();
    let options = ScanOptions {
        probe_media: true,
        tools: None,
        decode_check: false,
    };
    let report = check_path(&toml, &options).unwrap();
    report
        .problems
        .iter()
        .filter(|p| p.is_error())
        .map(ToString::to_string)
        .collect()
}

#[test]
fn a_batch_size_larger_than_every_bucket_is_an_error() {
    let errors = check(100_000, 1);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].contains("batch_size = 100000 but its largest bucket holds 3 sample(s)")
            && errors[0].contains("set batch_size to 3 or less"),
        "{errors:#?}"
    );
    assert!(check(3, 1).is_empty());
    // Repeats fill a bucket: 3 images twice make batches of 6.
    assert!(check(6, 2).is_empty());
}
