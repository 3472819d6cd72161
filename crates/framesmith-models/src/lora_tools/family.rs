//! Which model family an adapter file is for, from its module names in any layout (`--family` decides when the
//! names cannot: FLUX.1's and HunyuanVideo 1.5's double blocks share names in ComfyUI's layout, and so do FLUX.1's
//! double blocks in diffusers' names and Qwen-Image's attention).

use anyhow::{bail, Result};
use framesmith_nn::lora::LoraFamily;

/// The names `--family` takes, with their families.
pub const FAMILY_NAMES: [(&str, LoraFamily); 4] = [
    ("wan", LoraFamily::Wan),
    ("flux", LoraFamily::Flux),
    ("qwen-image", LoraFamily::QwenImage),
    ("hunyuan-video-1.5", LoraFamily::HunyuanVideo15),
];

/// The family named `name` (`wan`, `flux`, `qwen-image`, `hunyuan-video-1.5`).
pub fn parse_family(name: &str) -> Result<LoraFamily, String> {
    FAMILY_NAMES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, f)| *f)
        .ok_or_else(|| {
            let names: Vec<&str> = FAMILY_NAMES.iter().map(|(n, _)| *n).collect();
            format!("unknown family `{name}` (expected {})", names.join(", "))
        })
}

/// The name `--family` gives `family`.
pub fn family_name(family: LoraFamily) -> &'static str {
    FAMILY_NAMES
        .iter()
        .find(|(_, f)| *f == family)
        .map_or("wan", |(n, _)| *n)
}

/// The highest block index after `list` (`double_blocks_27_…`, `double_blocks.27.…`) in `name`.
fn block_index(name: &str, list: &str) -> Option<usize> {
    let at = name.find(list)? + list.len();
    let digits: String = name
        .get(at + 1..)?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The family of an adapter from its tensor (or module) names, in any layout.
pub fn detect(names: &[&str]) -> Result<LoraFamily> {
    // Module names ending in a dot, whether or not the tensor's part followed, so `q.` marks a module ending in q.
    let modules: Vec<String> = names
        .iter()
        .map(|n| match crate::adapter_file::split(n) {
            Some((module, _)) => format!("{module}."),
            None => format!("{n}."),
        })
        .collect();
    let any = |pats: &[&str]| modules.iter().any(|m| pats.iter().any(|p| m.contains(p)));
    let max_index = |list: &str| modules.iter().filter_map(|m| block_index(m, list)).max();
    let single = any(&["single_blocks", "single_transformer_blocks"]);
    let flux_diffusers = any(&[
        "ff_context",
        "ff.net",
        "ff_net",
        "norm1.linear",
        "norm1_linear",
    ]);
    let hunyuan = any(&[
        "img_attn_q.",
        "img_attn_k.",
        "txt_attn_q.",
        "_mlp_fc1.",
        "_mod_linear.",
    ]) || (!single && max_index("double_blocks").is_some_and(|i| i >= 19));
    let qwen = any(&[
        "img_mlp.net",
        "img_mlp_net",
        "txt_mlp.net",
        "img_mod.1",
        "img_mod_1",
        "txt_mod_1",
    ]) || (!single && max_index("transformer_blocks").is_some_and(|i| i >= 19));
    let wan = any(&["self_attn", "cross_attn", "attn1", "attn2"])
        || modules.iter().any(|m| m.contains("ffn"));
    let found: Vec<LoraFamily> = [
        (wan, LoraFamily::Wan),
        (single || flux_diffusers, LoraFamily::Flux),
        (qwen, LoraFamily::QwenImage),
        (hunyuan, LoraFamily::HunyuanVideo15),
    ]
    .into_iter()
    .filter_map(|(hit, f)| hit.then_some(f))
    .collect();
    match found.as_slice() {
        [one] => Ok(*one),
        [] if any(&["double_blocks", "transformer_blocks"]) => bail!(
            "the module names fit more than one family (FLUX.1 and HunyuanVideo 1.5, or FLUX.1 and Qwen-Image); \
             say which with --family"
        ),
        [] => bail!("no module of a known family (Wan, FLUX.1, Qwen-Image, HunyuanVideo 1.5); say which with --family"),
        _ => bail!("the module names mix several families; say which with --family"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_family_is_told_by_its_names_and_ambiguity_asks_for_family() {
        let cases: [(&[&str], LoraFamily); 6] = [
            (&["lora_unet_blocks_0_self_attn_q"], LoraFamily::Wan),
            (&["transformer.blocks.0.attn1.to_q"], LoraFamily::Wan),
            (
                &[
                    "lora_unet_single_blocks_0_linear1",
                    "lora_unet_double_blocks_0_img_attn_qkv",
                ],
                LoraFamily::Flux,
            ),
            (
                &["transformer.transformer_blocks.0.ff.net.2"],
                LoraFamily::Flux,
            ),
            (
                &["diffusion_model.transformer_blocks.0.img_mlp.net.2"],
                LoraFamily::QwenImage,
            ),
            (
                &["lora_unet_double_blocks_0_img_attn_q"],
                LoraFamily::HunyuanVideo15,
            ),
        ];
        for (names, want) in cases {
            assert_eq!(detect(names).ok(), Some(want), "{names:?}");
        }
        let err = detect(&["lora_unet_double_blocks_0_img_attn_qkv"])
            .err()
            .map(|e| e.to_string());
        assert!(err.unwrap_or_default().contains("--family"));
        assert_eq!(parse_family("qwen-image"), Ok(LoraFamily::QwenImage));
        assert!(parse_family("sdxl").is_err_and(|e| e.contains("hunyuan-video-1.5")));
    }
}
