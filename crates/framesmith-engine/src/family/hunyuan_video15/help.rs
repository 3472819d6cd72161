//! What HunyuanVideo 1.5's models take from the flags of the commands whose flags differ by family, for their
//! `--help`.

use crate::family::CliCommand;

/// HunyuanVideo 1.5's part of the `--help` of `command`.
pub(super) fn flag_help(command: CliCommand) -> Option<&'static str> {
    match command {
        CliCommand::Generate => Some(
            "a clip (an MP4 --out; PNG frames go to a `<name>_frames` folder beside it). --dit the transformer, \
             --vae hunyuanvideo15_vae_fp16.safetensors, --text-encoder Qwen2.5-VL-7B (qwen_2.5_vl_7b.safetensors \
             or the release's text_encoder/llm) with --byt5 the glyph encoder (default: the one beside it); \
             image-to-video: --image the start image with --clip the SigLIP image encoder (FLUX.1-Redux-dev's \
             folder, the release's vision_encoder/siglip, or ComfyUI's sigclip_vision_patch14_384.safetensors). \
             Defaults: 848x480 (with --image, the official 480p size for its aspect ratio), 121 frames, 50 steps, \
             shift 5 (720p: 9, I2V 7), guidance 6, euler",
        ),
        CliCommand::CacheLatents => Some(
            "images and clips. --vae the HunyuanVideo 1.5 VAE (hunyuanvideo15_vae_fp16.safetensors or the \
             release's vae/); --clip the SigLIP image encoder (FLUX.1-Redux-dev's folder, the release's \
             vision_encoder/siglip, or ComfyUI's sigclip_vision_patch14_384.safetensors) caches each first frame's \
             image-to-video conditioning: its latents and mask and its SigLIP features",
        ),
        CliCommand::CacheText | CliCommand::Plan => None,
    }
}
