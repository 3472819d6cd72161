//! What an LTX-2 checkpoint's `config` metadata says of its text side, as ltx-core's configurators read it: the
//! video connector's sizes (`Embeddings1DConnectorConfigurator`: `connector_num_attention_heads` 30,
//! `connector_attention_head_dim` 128, `connector_num_layers` 2, `connector_positional_embedding_max_pos` [1],
//! `connector_apply_gated_attention`, the transformer's `rope_type` and `frequencies_precision`; 128 learnable
//! registers and RoPE θ 10⁴ always) and which feature extractor the release has (`_create_feature_extractor`:
//! none of LTX-2.3's four caption-projection keys → V1, LTX-2's; all four with LTX-2.3's values → V2; anything
//! between refused, as ltx-core refuses it).

use serde_json::Value;

/// Learnable registers of every release's connector (ltx-core's default; the configurator does not change it).
pub const CONNECTOR_REGISTERS: usize = 128;
/// The connector's RoPE base (ltx-core's default; the configurator does not change it).
pub const CONNECTOR_THETA: f64 = 10_000.0;

/// The four keys of LTX-2.3's caption projection and the values ltx-core accepts.
const V2_KEYS: [(&str, bool); 4] = [
    ("caption_proj_before_connector", true),
    ("caption_projection_first_linear", false),
    ("caption_proj_input_norm", false),
    ("caption_projection_second_linear", false),
];

/// How Gemma's hidden states become the connector's input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeatureVersion {
    /// LTX-2 (19B): each layer normalised by its masked mean and range over the prompt's tokens, all layers
    /// projected by `aggregate_embed` (no bias) to Gemma's width.
    V1,
    /// LTX-2.3 (22B): each token of each layer RMS-normalised, rescaled by `√(video_dim / gemma_width)`, projected
    /// by `video_aggregate_embed` (with bias) to the transformer's width `video_dim`; the audio stream's features
    /// likewise by `audio_aggregate_embed` to the audio stream's width `audio_dim` (LTX-2 gives both streams the
    /// same features).
    V2 { video_dim: usize, audio_dim: usize },
}

/// The video connector (`Embeddings1DConnector`).
#[derive(Debug, Clone, PartialEq)]
pub struct ConnectorConfig {
    pub heads: usize,
    pub head_dim: usize,
    pub layers: usize,
    /// RoPE position divisors (one axis).
    pub max_pos: Vec<f64>,
    /// Per-head output gates (`to_gate_logits`).
    pub gated_attention: bool,
    /// `split` (every release) or the legacy `interleaved`.
    pub rope_type: String,
    /// `float64`: the RoPE frequency grid in double precision.
    pub frequencies_precision: Option<String>,
}

impl ConnectorConfig {
    /// Its width (heads × head width).
    pub fn inner_dim(&self) -> usize {
        self.heads * self.head_dim
    }
}

/// An LTX-2 checkpoint's text side.
#[derive(Debug, Clone, PartialEq)]
pub struct Ltx2TextConfig {
    pub connector: ConnectorConfig,
    pub features: FeatureVersion,
    /// The audio connector (`AudioEmbeddings1DConnectorConfigurator`: `audio_connector_num_attention_heads`,
    /// `audio_connector_attention_head_dim`, `audio_connector_num_layers`, each falling back to the video
    /// connector's; the rest shared with it).
    pub audio_connector: ConnectorConfig,
}

impl Ltx2TextConfig {
    /// Reads the `transformer` section of the checkpoint's config (a JSON object).
    pub fn from_transformer_json(t: &Value) -> Result<Self, String> {
        let size = |k: &str, default: usize| {
            t.get(k)
                .and_then(Value::as_u64)
                .map_or(default, |v| v as usize)
        };
        let flag = |k: &str| t.get(k).and_then(Value::as_bool).unwrap_or(false);
        let max_pos = match t.get("connector_positional_embedding_max_pos") {
            None => vec![1.0],
            Some(v) => v
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_f64).collect::<Vec<_>>())
                .filter(|a| a.len() == 1)
                .ok_or_else(|| {
                    format!(
                        "connector_positional_embedding_max_pos {v} is not one number in a list"
                    )
                })?,
        };
        let heads = size("connector_num_attention_heads", 30);
        let head_dim = size("connector_attention_head_dim", 128);
        let layers = size("connector_num_layers", 2);
        let connector = ConnectorConfig {
            heads,
            head_dim,
            layers,
            max_pos,
            gated_attention: flag("connector_apply_gated_attention"),
            rope_type: t
                .get("rope_type")
                .and_then(Value::as_str)
                .unwrap_or("split")
                .to_string(),
            frequencies_precision: t
                .get("frequencies_precision")
                .and_then(Value::as_str)
                .map(str::to_string),
        };
        if connector.rope_type != "split" {
            return Err(format!(
                "RoPE type `{}` (only `split` is supported)",
                connector.rope_type
            ));
        }
        if connector.heads == 0 || connector.head_dim % 2 != 0 {
            return Err("the connector's heads must exist and have an even width".into());
        }
        let audio_connector = ConnectorConfig {
            heads: size("audio_connector_num_attention_heads", heads),
            head_dim: size("audio_connector_attention_head_dim", head_dim),
            layers: size("audio_connector_num_layers", layers),
            ..connector.clone()
        };
        if audio_connector.heads == 0 || audio_connector.head_dim % 2 != 0 {
            return Err("the audio connector's heads must exist and have an even width".into());
        }
        let features = features_of(t)?;
        Ok(Self {
            connector,
            features,
            audio_connector,
        })
    }

    /// Reads the text side from a checkpoint's `config` metadata entry (`{"transformer": {…}, …}` as JSON).
    pub fn from_metadata_config(config: &str) -> Result<Self, String> {
        let parsed: Value =
            serde_json::from_str(config).map_err(|e| format!("the config does not parse: {e}"))?;
        let section = parsed
            .get("transformer")
            .ok_or("the config has no `transformer` section")?;
        Self::from_transformer_json(section)
    }

    /// The width of the connector's output, what the cache holds: Gemma's width for V1, the transformer's for V2.
    pub fn output_width(&self) -> usize {
        self.connector.inner_dim()
    }

    /// The keys of the transformer section that say this text side (for writers of test and benchmark files).
    pub fn transformer_keys(&self) -> serde_json::Map<String, Value> {
        let c = &self.connector;
        let mut keys = serde_json::json!({
            "connector_num_attention_heads": c.heads,
            "connector_attention_head_dim": c.head_dim,
            "connector_num_layers": c.layers,
            "connector_positional_embedding_max_pos": c.max_pos,
            "connector_apply_gated_attention": c.gated_attention,
        });
        if let (FeatureVersion::V2 { .. }, Some(map)) = (self.features, keys.as_object_mut()) {
            for (k, v) in V2_KEYS {
                map.insert(k.to_string(), Value::Bool(v));
            }
        }
        let a = &self.audio_connector;
        if let Some(map) = keys.as_object_mut() {
            map.insert("audio_connector_num_attention_heads".into(), a.heads.into());
            map.insert(
                "audio_connector_attention_head_dim".into(),
                a.head_dim.into(),
            );
            map.insert("audio_connector_num_layers".into(), a.layers.into());
        }
        keys.as_object().cloned().unwrap_or_default()
    }

    /// The text side's tensors in a release's single file for Gemma states of `gemma_width` × `states`, with
    /// their shapes and whether each is a linear weight (for writers of test and benchmark files).
    pub fn tensor_shapes(
        &self,
        gemma_width: usize,
        states: usize,
    ) -> Vec<(String, Vec<usize>, bool)> {
        let flat = gemma_width * states;
        let mut out = match self.features {
            FeatureVersion::V1 => vec![(
                "text_embedding_projection.aggregate_embed.weight".to_string(),
                vec![gemma_width, flat],
                true,
            )],
            FeatureVersion::V2 { video_dim, .. } => vec![
                (
                    "text_embedding_projection.video_aggregate_embed.weight".to_string(),
                    vec![video_dim, flat],
                    true,
                ),
                (
                    "text_embedding_projection.video_aggregate_embed.bias".to_string(),
                    vec![video_dim],
                    false,
                ),
            ],
        };
        out.extend(connector_shapes(
            &self.connector,
            "model.diffusion_model.video_embeddings_connector",
        ));
        out
    }

    /// [`Self::tensor_shapes`] with the audio side too: LTX-2.3's `audio_aggregate_embed` and the audio
    /// connector (`audio_embeddings_connector`), as the audio-video releases hold them.
    pub fn tensor_shapes_av(
        &self,
        gemma_width: usize,
        states: usize,
    ) -> Vec<(String, Vec<usize>, bool)> {
        let mut out = self.tensor_shapes(gemma_width, states);
        if let FeatureVersion::V2 { audio_dim, .. } = self.features {
            let p = "text_embedding_projection.audio_aggregate_embed";
            out.push((
                format!("{p}.weight"),
                vec![audio_dim, gemma_width * states],
                true,
            ));
            out.push((format!("{p}.bias"), vec![audio_dim], false));
        }
        out.extend(connector_shapes(
            &self.audio_connector,
            "model.diffusion_model.audio_embeddings_connector",
        ));
        out
    }
}

/// Which feature extractor the transformer section `t` selects (`_create_feature_extractor`): none of LTX-2.3's
/// caption-projection keys → V1; all of them with LTX-2.3's values → V2 at the streams' widths; else refused.
fn features_of(t: &Value) -> Result<FeatureVersion, String> {
    let size = |k: &str, default: usize| {
        t.get(k)
            .and_then(Value::as_u64)
            .map_or(default, |v| v as usize)
    };
    let present = V2_KEYS.iter().filter(|(k, _)| t.get(*k).is_some()).count();
    if present == 0 {
        return Ok(FeatureVersion::V1);
    }
    if present < V2_KEYS.len() {
        let missing: Vec<_> = V2_KEYS
            .iter()
            .filter(|(k, _)| t.get(*k).is_none())
            .map(|(k, _)| *k)
            .collect();
        return Err(format!(
            "a partial LTX-2.3 caption-projection config (missing {})",
            missing.join(", ")
        ));
    }
    if let Some((k, want)) = V2_KEYS
        .iter()
        .find(|(k, want)| t.get(*k).and_then(Value::as_bool) != Some(*want))
    {
        return Err(format!("{k} = {} (LTX-2.3 has {want})", t[*k]));
    }
    Ok(FeatureVersion::V2 {
        video_dim: size("num_attention_heads", 32) * size("attention_head_dim", 128),
        audio_dim: size("audio_num_attention_heads", 32) * size("audio_attention_head_dim", 64),
    })
}

/// The tensors of a connector of `c` under `p`, with their shapes and whether each is a linear weight.
fn connector_shapes(c: &ConnectorConfig, p: &str) -> Vec<(String, Vec<usize>, bool)> {
    let d = c.inner_dim();
    let mut out = Vec::new();
    out.push((
        format!("{p}.learnable_registers"),
        vec![CONNECTOR_REGISTERS, d],
        false,
    ));
    for i in 0..c.layers {
        let b = format!("{p}.transformer_1d_blocks.{i}");
        let mut linears = vec![
            ("attn1.to_q", d, d),
            ("attn1.to_k", d, d),
            ("attn1.to_v", d, d),
            ("attn1.to_out.0", d, d),
            ("ff.net.0.proj", d, 4 * d),
            ("ff.net.2", 4 * d, d),
        ];
        if c.gated_attention {
            linears.push(("attn1.to_gate_logits", d, c.heads));
        }
        for (name, fan_in, fan_out) in linears {
            out.push((format!("{b}.{name}.weight"), vec![fan_out, fan_in], true));
            out.push((format!("{b}.{name}.bias"), vec![fan_out], false));
        }
        out.push((format!("{b}.attn1.q_norm.weight"), vec![d], false));
        out.push((format!("{b}.attn1.k_norm.weight"), vec![d], false));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_releases_text_sides_are_told_apart() -> Result<(), String> {
        let ltx2 =
            Ltx2TextConfig::from_transformer_json(&serde_json::json!({"caption_channels": 3840}))?;
        assert_eq!(ltx2.features, FeatureVersion::V1);
        assert_eq!(
            (ltx2.connector.inner_dim(), ltx2.connector.layers),
            (3840, 2)
        );
        let ltx23 = Ltx2TextConfig::from_transformer_json(&serde_json::json!({
            "caption_proj_before_connector": true, "caption_projection_first_linear": false,
            "caption_proj_input_norm": false, "caption_projection_second_linear": false,
            "connector_num_attention_heads": 32, "connector_num_layers": 8, "connector_apply_gated_attention": true,
        }))?;
        assert_eq!(
            ltx23.features,
            FeatureVersion::V2 {
                video_dim: 4096,
                audio_dim: 2048
            }
        );
        // The audio connector falls back to the video connector's sizes unless given its own.
        assert_eq!(
            (ltx23.audio_connector.heads, ltx23.audio_connector.layers),
            (32, 8)
        );
        let own = Ltx2TextConfig::from_transformer_json(&serde_json::json!({
            "audio_connector_num_attention_heads": 16, "audio_connector_attention_head_dim": 64,
        }))?;
        assert_eq!(own.audio_connector.inner_dim(), 1024);
        assert_eq!(
            (ltx23.output_width(), ltx23.connector.gated_attention),
            (4096, true)
        );
        let partial = Ltx2TextConfig::from_transformer_json(
            &serde_json::json!({"caption_proj_before_connector": true}),
        );
        assert!(partial.is_err_and(|e| e.contains("caption_projection_first_linear")));
        let wrong = Ltx2TextConfig::from_transformer_json(&serde_json::json!({
            "caption_proj_before_connector": true, "caption_projection_first_linear": true,
            "caption_proj_input_norm": false, "caption_projection_second_linear": false,
        }));
        assert!(wrong.is_err_and(|e| e.contains("caption_projection_first_linear = true")));
        Ok(())
    }
}
