//! What Wan's models take from the flags of the commands whose flags differ by family, for their `--help`.

use crate::family::CliCommand;

/// Wan's part of the `--help` of `command`.
pub(super) fn flag_help(command: CliCommand) -> &'static str {
    match command {
        CliCommand::Generate => {
            "a clip (an MP4 --out; PNG frames go to a `<name>_frames` folder beside it). --dit the DiT, for Wan2.2 \
             A14B the high-noise expert and --dit-low-noise the low-noise one (--gpus 0,1: one on each card); \
             --text-encoder umT5 (models_t5_umt5-xxl-enc-bf16.pth or a ComfyUI umt5_xxl .safetensors) with \
             --tokenizer google/umt5-xxl's tokenizer.json or spiece.model (default: one beside the weights, else \
             the tokenizer inside ComfyUI's file); --vae the Wan VAE; --image for image-to-video models (Wan2.1 \
             I2V, Wan2.2 I2V-A14B, TI2V-5B); --clip for Wan2.1 I2V (models_clip_open-clip-xlm-roberta-large-vit-\
             huge-14.pth or ComfyUI's clip_vision_h.safetensors). Defaults: 832x480 (with --image, the official \
             size for its aspect ratio), 81 frames, 50 steps, shift 5, guidance 5 with the official negative \
             prompt, unipc"
        }
        CliCommand::CacheLatents => {
            "images and clips. --vae the Wan VAE (Wan2.1_VAE.pth, Wan2.2_VAE.pth or a ComfyUI .safetensors); an \
             image-to-video --dit (Wan2.1 I2V, Wan2.2 I2V-A14B) or --i2v also caches the first frame's \
             conditioning; --clip (Wan2.1 I2V: models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth or \
             ComfyUI's clip_vision_h.safetensors) also its CLIP features"
        }
        CliCommand::CacheText => {
            "--text-encoder umT5 (models_t5_umt5-xxl-enc-bf16.pth or a ComfyUI umt5_xxl .safetensors) with \
             --tokenizer google/umt5-xxl's tokenizer.json or spiece.model (default: one beside the weights, else \
             the tokenizer inside ComfyUI's file)"
        }
        CliCommand::Plan => {
            "--variant t2v-1.3b, t2v-14b, i2v-14b, t2v-a14b, i2v-a14b or ti2v-5b; --checkpointing attention_projection also keeps each block's self_attn.o output"
        }
    }
}
