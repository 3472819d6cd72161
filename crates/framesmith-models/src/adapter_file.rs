//! What an adapter file holds, from its tensor names and shapes and its metadata (headers only): its kinds (LoRA,
//! LoKr, LoHa, DoRA, as musubi-tuner, LyCORIS and ComfyUI write them), key layout, ranks, the blocks it covers and
//! what its metadata says it was trained on (the report around it gives dtypes and parameters). Family-neutral:
//! `framesmith inspect` shows it for any model's adapter.

use std::collections::{BTreeMap, BTreeSet};

/// One tensor of the file, as its header lists it.
#[derive(Debug, Clone, Copy)]
pub struct HeaderTensor<'a> {
    pub name: &'a str,
    pub shape: &'a [usize],
}

/// The adapter kinds, by the tensor names that mark them (after the module name and a dot).
const KINDS: [(&str, &[&str]); 4] = [
    ("LoKr", &["lokr_w1", "lokr_w1_a", "lokr_w2", "lokr_w2_a"]),
    ("LoHa", &["hada_w1_a", "hada_w2_a"]),
    ("DoRA", &["dora_scale"]),
    (
        "LoRA",
        &[
            "lora_down.weight",
            "lora_A.weight",
            "lora_up.weight",
            "lora_B.weight",
        ],
    ),
];
/// Tensor names an adapter module is made of (the part after the module's name).
const PARTS: [&str; 17] = [
    "lora_down.weight",
    "lora_up.weight",
    "lora_A.weight",
    "lora_B.weight",
    "alpha",
    "dora_scale",
    "lokr_w1",
    "lokr_w1_a",
    "lokr_w1_b",
    "lokr_w2",
    "lokr_w2_a",
    "lokr_w2_b",
    "lokr_t2",
    "hada_w1_a",
    "hada_w1_b",
    "hada_w2_a",
    "hada_w2_b",
];

/// Whether `names` are an adapter's: some tensor is a part of an adapter module.
pub fn is_adapter<'a>(mut names: impl Iterator<Item = &'a str>) -> bool {
    names.any(|n| split(n).is_some())
}

/// The module and part of an adapter tensor's name (`lora_unet_blocks_0_ffn_0`, `lora_down.weight`).
pub(crate) fn split(name: &str) -> Option<(&str, &str)> {
    PARTS
        .iter()
        .find_map(|part| Some((name.strip_suffix(part)?.strip_suffix('.')?, *part)))
}

/// The title and details `framesmith inspect` shows for an adapter file.
pub fn describe(
    tensors: &[HeaderTensor<'_>],
    metadata: &BTreeMap<String, String>,
) -> (String, Vec<(&'static str, String)>) {
    let mut modules: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for t in tensors {
        if let Some((module, part)) = split(t.name) {
            modules.entry(module).or_default().insert(part);
        }
    }
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for parts in modules.values() {
        let kind = KINDS
            .iter()
            .find(|(_, marks)| marks.iter().any(|m| parts.contains(m)))
            .map_or("alpha only", |(k, _)| *k);
        *kinds.entry(kind).or_default() += 1;
    }
    let title = match kinds.keys().copied().collect::<Vec<_>>().as_slice() {
        [one] if *one == "LoRA" => "LoRA adapter".to_string(),
        [one] => format!("{one} adapter (LyCORIS)"),
        many => format!("adapter of several kinds ({})", many.join(", ")),
    };
    let mut details = vec![
        ("format", key_format(tensors).to_string()),
        ("modules", module_summary(&kinds, &modules)),
        ("rank", rank(tensors)),
    ];
    for (key, label) in [
        ("ss_network_alpha", "alpha"),
        ("ss_base_model_version", "base model"),
        ("modelspec.architecture", "architecture"),
        ("ss_network_module", "network"),
        ("ss_steps", "trained steps"),
    ] {
        if let Some(value) = metadata.get(key) {
            details.push((label, value.clone()));
        }
    }
    (title, details)
}

fn key_format(tensors: &[HeaderTensor<'_>]) -> &'static str {
    if tensors.iter().any(|t| t.name.starts_with("lora_unet_")) {
        "musubi-tuner / kohya keys (lora_unet_…)"
    } else if tensors.iter().any(|t| t.name.contains(".lora_A.")) {
        "ComfyUI / diffusers keys (lora_A / lora_B)"
    } else {
        "module-path keys (lora_down / lora_up or LyCORIS names)"
    }
}

/// "840 LoRA in 60 transformer_blocks", "12 LoKr, 4 LoRA in 19 double_blocks and 38 single_blocks".
fn module_summary(
    kinds: &BTreeMap<&str, usize>,
    modules: &BTreeMap<&str, BTreeSet<&str>>,
) -> String {
    let counts: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
    let mut groups: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
    for module in modules.keys() {
        if let Some((group, index)) = block_of(module) {
            groups.entry(group).or_default().insert(index);
        }
    }
    let blocks: Vec<String> = groups
        .iter()
        .map(|(g, indices)| format!("{} {g}", indices.len()))
        .collect();
    match blocks.as_slice() {
        [] => counts.join(", "),
        _ => format!("{} in {}", counts.join(", "), blocks.join(" and ")),
    }
}

/// The block group and index of a module name: `lora_unet_double_blocks_3_img_attn_qkv` → (`double_blocks`, 3),
/// `diffusion_model.transformer_blocks.7.attn.to_q` → (`transformer_blocks`, 7).
pub(crate) fn block_of(module: &str) -> Option<(String, usize)> {
    let at = module.find("blocks")?;
    let rest = &module[at + "blocks".len()..];
    let digits: String = rest
        .strip_prefix(['_', '.'])?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let index = digits.parse().ok()?;
    let head = &module[..at];
    let start = head
        .trim_end_matches('_')
        .rfind(['.', '_'])
        .map_or(0, |i| i + 1);
    // `lora_unet_double_blocks`: the word before `blocks` names the group unless it is the prefix's.
    let word = &head[start..];
    let group = match word.trim_end_matches('_') {
        "" | "unet" => "blocks".to_string(),
        w => format!("{w}_blocks"),
    };
    Some((group, index))
}

/// The ranks of the modules: the rows of their down factors (LoRA, DoRA, LoHa), or "full" for LoKr's unfactored
/// right factor.
fn rank(tensors: &[HeaderTensor<'_>]) -> String {
    let mut ranks = BTreeSet::new();
    let mut full = 0;
    for t in tensors {
        let Some((_, part)) = split(t.name) else {
            continue;
        };
        match part {
            "lora_down.weight" | "lora_A.weight" | "hada_w1_b" | "lokr_w2_b" => {
                ranks.extend(t.shape.first().copied());
            }
            "lokr_w2" => full += 1,
            _ => {}
        }
    }
    let mut out = match (ranks.first(), ranks.last()) {
        (Some(lo), Some(hi)) if lo == hi => lo.to_string(),
        (Some(lo), Some(hi)) => format!("{lo} to {hi} (varies by module)"),
        _ => String::new(),
    };
    if full > 0 {
        let sep = if out.is_empty() { "" } else { "; " };
        out = format!("{out}{sep}{full} LoKr modules with a full (unfactored) right factor");
    }
    if out.is_empty() {
        "unknown (no down factors)".into()
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header<'a>(rows: &'a [(String, Vec<usize>)]) -> Vec<HeaderTensor<'a>> {
        rows.iter()
            .map(|(name, shape)| HeaderTensor { name, shape })
            .collect()
    }

    fn shown(rows: &[(String, Vec<usize>)], metadata: &[(&str, &str)]) -> (String, String) {
        let metadata = metadata
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (title, details) = describe(&header(rows), &metadata);
        let text = details
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join("\n");
        (title, text)
    }

    #[test]
    fn a_musubi_lora_names_its_blocks_rank_and_metadata() {
        let mut rows = Vec::new();
        for block in ["double_blocks_0", "double_blocks_1", "single_blocks_0"] {
            let m = format!("lora_unet_{block}_img_attn_qkv");
            rows.push((format!("{m}.lora_down.weight"), vec![16, 64]));
            rows.push((format!("{m}.lora_up.weight"), vec![192, 16]));
            rows.push((format!("{m}.alpha"), vec![]));
        }
        let (title, text) = shown(&rows, &[("ss_network_alpha", "16"), ("ss_steps", "500")]);
        assert_eq!(title, "LoRA adapter");
        assert!(
            text.contains("modules: 3 LoRA in 2 double_blocks and 1 single_blocks"),
            "{text}"
        );
        assert!(
            text.lines().any(|l| l == "rank: 16") && text.contains("musubi-tuner"),
            "{text}"
        );
        assert!(
            text.contains("alpha: 16") && text.contains("trained steps: 500"),
            "{text}"
        );
        assert!(is_adapter(rows.iter().map(|(n, _)| n.as_str())));
        assert!(!is_adapter(["blocks.0.self_attn.q.weight"].into_iter()));
    }

    #[test]
    fn lycoris_kinds_are_named_with_their_ranks() {
        let m = "lora_unet_transformer_blocks_3_attn_to_q";
        let lokr = vec![
            (format!("{m}.lokr_w1"), vec![8, 8]),
            (format!("{m}.lokr_w2_a"), vec![48, 4]),
            (format!("{m}.lokr_w2_b"), vec![4, 48]),
            (format!("{m}.alpha"), vec![]),
        ];
        let (title, text) = shown(&lokr, &[]);
        assert_eq!(title, "LoKr adapter (LyCORIS)");
        assert!(
            text.contains("1 LoKr in 1 transformer_blocks") && text.lines().any(|l| l == "rank: 4"),
            "{text}"
        );
        let full = vec![
            (format!("{m}.lokr_w1"), vec![8, 8]),
            (format!("{m}.lokr_w2"), vec![48, 48]),
        ];
        assert!(shown(&full, &[]).1.contains("1 LoKr modules with a full"));
        let loha = vec![
            (format!("{m}.hada_w1_a"), vec![64, 8]),
            (format!("{m}.hada_w1_b"), vec![8, 64]),
            (format!("{m}.hada_w2_a"), vec![64, 8]),
            (format!("{m}.hada_w2_b"), vec![8, 64]),
        ];
        assert_eq!(shown(&loha, &[]).0, "LoHa adapter (LyCORIS)");
        let mut mixed = loha.clone();
        let d = "diffusion_model.blocks.5.ffn.0";
        mixed.push((format!("{d}.lora_A.weight"), vec![4, 64]));
        mixed.push((format!("{d}.lora_B.weight"), vec![64, 4]));
        mixed.push((format!("{d}.dora_scale"), vec![64, 1]));
        let (title, text) = shown(&mixed, &[]);
        assert_eq!(title, "adapter of several kinds (DoRA, LoHa)");
        assert!(text.contains("rank: 4 to 8 (varies by module)"), "{text}");
        assert!(text.contains("1 blocks and 1 transformer_blocks"), "{text}");
    }
}
