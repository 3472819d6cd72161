//! Wan LoRA module names in diffusers' `WanTransformer3DModel` (`blocks.0.attn1.to_q`) against the official ones
//! (`blocks.0.self_attn.q`), as diffusers' `_convert_non_diffusers_wan_lora_to_diffusers` maps them: the
//! diffusers/PEFT layout of `framesmith lora convert`.

/// Official block linear (under `blocks.{i}.`) → diffusers' name.
const DIFFUSERS: [(&str, &str); 12] = [
    ("self_attn.q", "attn1.to_q"),
    ("self_attn.k", "attn1.to_k"),
    ("self_attn.v", "attn1.to_v"),
    ("self_attn.o", "attn1.to_out.0"),
    ("cross_attn.q", "attn2.to_q"),
    ("cross_attn.k", "attn2.to_k"),
    ("cross_attn.v", "attn2.to_v"),
    ("cross_attn.o", "attn2.to_out.0"),
    ("cross_attn.k_img", "attn2.add_k_proj"),
    ("cross_attn.v_img", "attn2.add_v_proj"),
    ("ffn.0", "ffn.net.0.proj"),
    ("ffn.2", "ffn.net.2"),
];

/// `(index, linear)` of a block module path `blocks.{i}.{linear}`.
fn block_module(path: &str) -> Option<(&str, &str)> {
    let (index, linear) = path.strip_prefix("blocks.")?.split_once('.')?;
    (!index.is_empty() && index.bytes().all(|b| b.is_ascii_digit())).then_some((index, linear))
}

/// diffusers' module path of an official Wan block linear (`blocks.3.ffn.0` → `blocks.3.ffn.net.0.proj`).
pub fn to_diffusers(official: &str) -> Option<String> {
    let (index, linear) = block_module(official)?;
    let (_, theirs) = DIFFUSERS.iter().find(|(ours, _)| *ours == linear)?;
    Some(format!("blocks.{index}.{theirs}"))
}

/// The official module path of a diffusers Wan block linear (the inverse of [`to_diffusers`]).
pub fn from_diffusers(diffusers: &str) -> Option<String> {
    let (index, linear) = block_module(diffusers)?;
    let (ours, _) = DIFFUSERS.iter().find(|(_, theirs)| *theirs == linear)?;
    Some(format!("blocks.{index}.{ours}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_linear_maps_there_and_back() {
        for linear in framesmith_nn::lora::WAN_BLOCK_LINEARS {
            let ours = format!("blocks.12.{linear}");
            let theirs = to_diffusers(&ours);
            assert!(theirs.is_some(), "{ours}");
            assert_eq!(theirs.as_deref().and_then(from_diffusers), Some(ours));
        }
        assert_eq!(
            to_diffusers("blocks.0.cross_attn.k_img").as_deref(),
            Some("blocks.0.attn2.add_k_proj")
        );
        assert_eq!(to_diffusers("head.head"), None);
        assert_eq!(from_diffusers("blocks.x.attn1.to_q"), None);
    }
}
