//! What FLUX.1's models take from the flags of the commands whose flags differ by family, for their `--help`.

use crate::family::CliCommand;

/// FLUX.1's part of the `--help` of `command`.
pub(super) fn flag_help(command: CliCommand) -> &'static str {
    match command {
        CliCommand::Generate => {
            "one image from a FLUX.1 DiT (flux1-dev.safetensors) to a .png --out. --vae ae.safetensors, --t5 \
             (t5xxl_fp16.safetensors or t5xxl_fp8_e4m3fn_scaled.safetensors) with --tokenizer google/t5-v1_1-xxl's \
             tokenizer.json (default: one beside the --t5 weights), --clip-l clip_l.safetensors with \
             --clip-l-tokenizer its tokenizer.json (default: one beside it). Defaults: 1024x1024 (multiples of \
             16), 50 steps ([schnell] 4), the shift set by the image size, guidance 3.5 (the distilled guidance \
             strength [dev] takes), euler"
        }
        CliCommand::CacheLatents => "images only. --vae the FLUX.1 autoencoder ae.safetensors",
        CliCommand::CacheText => {
            "--t5 (t5xxl_fp16.safetensors or t5xxl_fp8_e4m3fn_scaled.safetensors) with --clip-l \
             (clip_l.safetensors); --tokenizer google/t5-v1_1-xxl's tokenizer.json, --clip-l-tokenizer CLIP-L's \
             (default: each beside its weights)"
        }
        CliCommand::Plan => "--variant flux-dev (FLUX.1 [dev] images)",
    }
}
