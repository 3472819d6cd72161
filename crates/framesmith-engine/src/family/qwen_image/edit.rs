//! Which Qwen-Image-Edit pipeline's text conditioning a run reproduces, and how an encoding made with control
//! images is recorded: the DiT's files say Edit (exactly one condition image, seen at ~1024²) or Edit-2509 and
//! later (one or more, each ~384², introduced as `Picture k:`); the tag of that encoding goes with the control
//! images' contents into a cache's record, so another pipeline or a changed control image is encoded again.

use std::path::{Path, PathBuf};

use framesmith_config::file_read::{read_bounded, ReadLimit};
use framesmith_data::control::control_stamp;
use framesmith_models::qwen25vl::EditPipeline;

/// The edit pipeline whose encoding the DiT `dit` takes: a diffusers folder's `model_index.json` says it by its
/// pipeline class; a single file by its name (ComfyUI's `qwen_image_edit_bf16` is Edit, `qwen_image_edit_2509_…`
/// and `…_2511_…` are Edit-2509 and later). Edit-2509's otherwise (also without a DiT): the release that takes
/// several images, which musubi-tuner recommends.
pub fn edit_pipeline_of(dit: Option<&Path>) -> EditPipeline {
    let Some(dit) = dit else {
        return EditPipeline::EditPlus;
    };
    for dir in dit.ancestors().take(3) {
        let Ok(bytes) = read_bounded(&dir.join("model_index.json"), ReadLimit::JSON) else {
            continue;
        };
        let text = String::from_utf8_lossy(&bytes);
        if text.contains("\"QwenImageEditPlusPipeline\"") {
            return EditPipeline::EditPlus;
        }
        if text.contains("\"QwenImageEditPipeline\"") {
            return EditPipeline::Edit;
        }
    }
    let name = dit
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .to_lowercase();
    let later = ["2509", "2511", "plus"].iter().any(|v| name.contains(v));
    if name.contains("edit") && !later {
        EditPipeline::Edit
    } else {
        EditPipeline::EditPlus
    }
}

/// The tag of `pipeline`'s encoding in a cache's record (musubi-tuner's `--model_version` names).
pub fn edit_tag(pipeline: EditPipeline) -> &'static str {
    match pipeline {
        EditPipeline::Edit => "edit",
        EditPipeline::EditPlus => "edit-2509",
    }
}

/// The record of the control images `paths` (of `what`, a prompt or an item, for messages) as `pipeline` encodes
/// them: its tag and the images' contents, as the text pass records them.
pub fn control_record(
    what: &Path,
    paths: &[PathBuf],
    pipeline: EditPipeline,
) -> anyhow::Result<String> {
    Ok(format!(
        "{} {}",
        edit_tag(pipeline),
        control_stamp(what, paths)?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dits_files_say_which_edit_pipeline() -> anyhow::Result<()> {
        let of = |name: &str| edit_pipeline_of(Some(Path::new(name)));
        assert_eq!(
            of("models/qwen_image_edit_bf16.safetensors"),
            EditPipeline::Edit
        );
        assert_eq!(
            of("qwen_image_edit_fp8_e4m3fn.safetensors"),
            EditPipeline::Edit
        );
        for plus in [
            "qwen_image_edit_2509_fp8_e4m3fn.safetensors",
            "Qwen-Image-Edit-2511.safetensors",
            "qwen_image_bf16.safetensors",
        ] {
            assert_eq!(of(plus), EditPipeline::EditPlus, "{plus}");
        }
        assert_eq!(edit_pipeline_of(None), EditPipeline::EditPlus);
        let dir = tempfile::tempdir()?;
        let transformer = dir.path().join("transformer");
        std::fs::create_dir_all(&transformer)?;
        std::fs::write(
            dir.path().join("model_index.json"),
            r#"{"_class_name": "QwenImageEditPipeline"}"#,
        )?;
        let shard = transformer.join("diffusion_pytorch_model-00001-of-00002.safetensors");
        assert_eq!(edit_pipeline_of(Some(&shard)), EditPipeline::Edit);
        assert_eq!(edit_pipeline_of(Some(&transformer)), EditPipeline::Edit);
        assert_eq!(edit_tag(EditPipeline::EditPlus), "edit-2509");
        Ok(())
    }
}
