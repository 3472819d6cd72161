//! Sizes and switches of the LTX-2 audio-video transformer as the official release embeds them: the `transformer`
//! section of the `config` entry in a checkpoint's safetensors metadata (what ltx-core's `LTXModelConfigurator`
//! reads, with its defaults), the two releases as named constructors, and which release a config is
//! ([`Ltx2Version`]): LTX-2 (19B) and LTX-2.3 (22B) share the block layout and differ in switches.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

fn default_heads() -> usize {
    32
}
fn default_head_dim() -> usize {
    128
}
fn default_channels() -> usize {
    128
}
fn default_layers() -> usize {
    48
}
fn default_cross_dim() -> usize {
    4096
}
fn default_eps() -> f64 {
    1e-6
}
fn default_theta() -> f64 {
    10000.0
}
fn default_max_pos() -> Vec<f64> {
    vec![20.0, 2048.0, 2048.0]
}
fn default_timestep_scale() -> f64 {
    1000.0
}
fn default_audio_head_dim() -> usize {
    64
}
fn default_audio_cross_dim() -> usize {
    2048
}
fn default_audio_max_pos() -> Vec<f64> {
    vec![20.0]
}
fn default_av_scale() -> f64 {
    1.0
}
fn default_true() -> bool {
    true
}
fn default_rope_type() -> String {
    "split".into()
}

/// The `transformer` section of a checkpoint's embedded config, with ltx-core's defaults for absent keys.
/// Unknown keys (the connector's, the VAE's switches) are ignored, as ltx-core does.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Ltx2Config {
    /// Video attention heads.
    #[serde(default = "default_heads")]
    pub num_attention_heads: usize,
    /// Width of one video head.
    #[serde(default = "default_head_dim")]
    pub attention_head_dim: usize,
    /// Latent channels of a video token (patch size 1).
    #[serde(default = "default_channels")]
    pub in_channels: usize,
    #[serde(default = "default_channels")]
    pub out_channels: usize,
    /// Blocks (`transformer_blocks.*`).
    #[serde(default = "default_layers")]
    pub num_layers: usize,
    /// Width of the text context the video cross-attention reads (after the caption projection).
    #[serde(default = "default_cross_dim")]
    pub cross_attention_dim: usize,
    /// Epsilon of every RMSNorm and of the output LayerNorm.
    #[serde(default = "default_eps")]
    pub norm_eps: f64,
    /// RoPE base.
    #[serde(default = "default_theta")]
    pub positional_embedding_theta: f64,
    /// The positions' divisors per axis (time in seconds, height and width in pixels).
    #[serde(default = "default_max_pos")]
    pub positional_embedding_max_pos: Vec<f64>,
    /// Sigma times this is the timestep the AdaLN embeds.
    #[serde(default = "default_timestep_scale")]
    pub timestep_scale_multiplier: f64,
    /// RoPE at the middle of each patch's bounds (every release).
    #[serde(default = "default_true")]
    pub use_middle_indices_grid: bool,
    #[serde(default = "default_heads")]
    pub audio_num_attention_heads: usize,
    #[serde(default = "default_audio_head_dim")]
    pub audio_attention_head_dim: usize,
    #[serde(default = "default_channels")]
    pub audio_in_channels: usize,
    #[serde(default = "default_channels")]
    pub audio_out_channels: usize,
    #[serde(default = "default_audio_cross_dim")]
    pub audio_cross_attention_dim: usize,
    #[serde(default = "default_audio_max_pos")]
    pub audio_positional_embedding_max_pos: Vec<f64>,
    /// The audio-video cross-attention gates' timestep scale.
    #[serde(default = "default_av_scale")]
    pub av_ca_timestep_scale_multiplier: f64,
    /// `split` (every release) or the legacy `interleaved`.
    #[serde(default = "default_rope_type")]
    pub rope_type: String,
    /// `float64`: the RoPE frequency grid computed in double precision (every release).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequencies_precision: Option<String>,
    /// Per-head output gates in every attention (`to_gate_logits`; LTX-2.3).
    #[serde(default)]
    pub apply_gated_attention: bool,
    /// The text cross-attention modulated by the timestep: nine AdaLN rows per block and a prompt AdaLN
    /// (`prompt_adaln_single`, `prompt_scale_shift_table`; LTX-2.3).
    #[serde(default)]
    pub cross_attention_adaln: bool,
    /// The prompt AdaLN's timestep MLP (off: only the static `prompt_scale_shift_table`).
    #[serde(default = "default_true")]
    pub use_prompt_adaln_single: bool,
    /// Biases in the video feed-forward (false from LTX 2.5 on).
    #[serde(default = "default_true")]
    pub ff_bias: bool,
    /// Biases in the audio feed-forward.
    #[serde(default = "default_true")]
    pub audio_ff_bias: bool,
    /// The caption projection runs in the text encoder's feature extractor (LTX-2.3); false: it is the
    /// transformer's `caption_projection` (LTX-2).
    #[serde(default)]
    pub caption_proj_before_connector: bool,
    /// Width of the connector's output that the transformer's caption projection reads (LTX-2: 3840).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caption_channels: Option<usize>,
    /// A learned marker added to single-pixel-frame tokens (keyframe checkpoints only).
    #[serde(default)]
    pub use_keyframes_abs_pos_embedding: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    qk_norm: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    standardization_norm: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    activation_fn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    norm_elementwise_affine: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    share_ff: Option<bool>,
}

/// The `config` metadata entry of a single file holding the transformer `cfg` (`{"transformer": {…}}`, every key
/// written), as the official releases carry it.
pub fn metadata_config(cfg: &Ltx2Config) -> String {
    serde_json::json!({ "transformer": cfg }).to_string()
}

/// Which release a checkpoint is, as its config and `model_version` say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ltx2Version {
    /// LTX-2 (19B): caption projection in the transformer, plain attention, no cross-attention AdaLN.
    Ltx2,
    /// LTX-2.3 (22B): gated attention, the text cross-attention modulated by the timestep (prompt AdaLN), the
    /// caption projection moved into the text encoder's feature extractor.
    Ltx23,
}

impl Ltx2Version {
    /// The release's name as users know it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ltx2 => "LTX-2",
            Self::Ltx23 => "LTX-2.3",
        }
    }
}

impl Ltx2Config {
    /// LTX-2 (19B, `ltx-2-19b-*.safetensors`): 48 blocks, 32 heads of 128, text through the transformer's
    /// caption projection from 3840 channels.
    pub fn ltx2_19b() -> Self {
        Self {
            num_attention_heads: 32,
            attention_head_dim: 128,
            in_channels: 128,
            out_channels: 128,
            num_layers: 48,
            cross_attention_dim: 4096,
            norm_eps: 1e-6,
            positional_embedding_theta: 10000.0,
            positional_embedding_max_pos: default_max_pos(),
            timestep_scale_multiplier: 1000.0,
            use_middle_indices_grid: true,
            audio_num_attention_heads: 32,
            audio_attention_head_dim: 64,
            audio_in_channels: 128,
            audio_out_channels: 128,
            audio_cross_attention_dim: 2048,
            audio_positional_embedding_max_pos: default_audio_max_pos(),
            av_ca_timestep_scale_multiplier: 1000.0,
            rope_type: default_rope_type(),
            frequencies_precision: Some("float64".into()),
            apply_gated_attention: false,
            cross_attention_adaln: false,
            use_prompt_adaln_single: true,
            ff_bias: true,
            audio_ff_bias: true,
            caption_proj_before_connector: false,
            caption_channels: Some(3840),
            use_keyframes_abs_pos_embedding: false,
            qk_norm: None,
            standardization_norm: None,
            activation_fn: None,
            norm_elementwise_affine: None,
            share_ff: None,
        }
    }

    /// LTX-2.3 (22B, `ltx-2.3-22b-*.safetensors`): LTX-2's sizes with gated attention and the cross-attention
    /// AdaLN, and no caption projection in the transformer.
    pub fn ltx23_22b() -> Self {
        let mut cfg = Self::ltx2_19b();
        cfg.caption_channels = None;
        cfg.caption_proj_before_connector = true;
        cfg.apply_gated_attention = true;
        cfg.cross_attention_adaln = true;
        cfg
    }

    /// Reads the `transformer` section (a JSON object).
    pub fn from_transformer_json(section: &serde_json::Value) -> serde_json::Result<Self> {
        Self::deserialize(section)
    }

    /// Reads the config from a checkpoint's safetensors metadata (`config` holds `{"transformer": {…}, …}` as
    /// a JSON string); `None` when the file carries no transformer config.
    pub fn from_metadata(
        metadata: &BTreeMap<String, String>,
    ) -> Option<serde_json::Result<(Self, Ltx2Version)>> {
        let config = metadata.get("config")?;
        let parsed: serde_json::Value = match serde_json::from_str(config) {
            Ok(v) => v,
            Err(e) => return Some(Err(e)),
        };
        let section = parsed.get("transformer")?;
        Some(Self::from_transformer_json(section).map(|cfg| {
            let version = cfg.version();
            (cfg, version)
        }))
    }

    /// Reads diffusers' `LTX2VideoTransformer3DModel` constructor arguments (a `transformer/config.json`), with
    /// diffusers' defaults for absent keys.
    pub fn from_diffusers_json(json: &str) -> serde_json::Result<Self> {
        let d: serde_json::Value = serde_json::from_str(json)?;
        let num = |k: &str, default: f64| {
            d.get(k)
                .and_then(serde_json::Value::as_f64)
                .unwrap_or(default)
        };
        let flag = |k: &str, default: bool| {
            d.get(k)
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(default)
        };
        let prompt_embeddings = flag("use_prompt_embeddings", true);
        let section = serde_json::json!({
            "num_attention_heads": num("num_attention_heads", 32.0) as usize,
            "attention_head_dim": num("attention_head_dim", 128.0) as usize,
            "in_channels": num("in_channels", 128.0) as usize,
            "out_channels": num("out_channels", num("in_channels", 128.0)) as usize,
            "num_layers": num("num_layers", 48.0) as usize,
            "cross_attention_dim": num("cross_attention_dim", 4096.0) as usize,
            "norm_eps": num("norm_eps", 1e-6),
            "positional_embedding_theta": num("rope_theta", 10000.0),
            "positional_embedding_max_pos": [
                num("pos_embed_max_pos", 20.0), num("base_height", 2048.0), num("base_width", 2048.0)
            ],
            "timestep_scale_multiplier": num("timestep_scale_multiplier", 1000.0),
            "av_ca_timestep_scale_multiplier": num("cross_attn_timestep_scale_multiplier", 1000.0),
            "rope_type": d.get("rope_type").and_then(serde_json::Value::as_str).unwrap_or("interleaved"),
            "frequencies_precision": if flag("rope_double_precision", true) { "float64" } else { "float32" },
            "apply_gated_attention": flag("gated_attn", false),
            "cross_attention_adaln": flag("cross_attn_mod", false),
            "use_prompt_adaln_single": flag("use_prompt_adaln_single", true),
            "ff_bias": flag("ff_bias", true),
            "caption_proj_before_connector": !prompt_embeddings,
            "caption_channels": prompt_embeddings.then(|| num("caption_channels", 3840.0) as usize),
        });
        Self::from_transformer_json(&section)
    }

    /// The release this config is: LTX-2.3's switches (gated attention, cross-attention AdaLN, the caption
    /// projection before the connector) mark it, any of them.
    pub fn version(&self) -> Ltx2Version {
        if self.apply_gated_attention
            || self.cross_attention_adaln
            || self.caption_proj_before_connector
        {
            Ltx2Version::Ltx23
        } else {
            Ltx2Version::Ltx2
        }
    }

    /// Video model width (heads × head width).
    pub fn inner_dim(&self) -> usize {
        self.num_attention_heads * self.attention_head_dim
    }

    /// Audio model width (audio heads × audio head width).
    pub fn audio_inner_dim(&self) -> usize {
        self.audio_num_attention_heads * self.audio_attention_head_dim
    }

    /// The RoPE divisor of the audio-video cross-attentions' time positions: the larger of the two streams'
    /// time divisors (ltx-core's `cross_pe_max_pos`).
    pub fn cross_max_pos(&self) -> f64 {
        let video = self.positional_embedding_max_pos.first().copied();
        let audio = self.audio_positional_embedding_max_pos.first().copied();
        video.unwrap_or(0.0).max(audio.unwrap_or(0.0))
    }

    /// Checks what the audio stream needs besides [`Self::validate`], collecting every problem: audio heads of
    /// even width, as many as the video's (ltx-core's configurator requires it: the cross-attentions' RoPE tables
    /// are split by either stream's head count), one time axis, and the audio text width and the cross-attentions'
    /// width equal to the audio model width.
    pub fn validate_audio(&self) -> candle_core::Result<()> {
        let mut problems = Vec::new();
        if self.audio_num_attention_heads == 0 || self.audio_attention_head_dim % 2 != 0 {
            problems.push("audio attention heads must exist and have an even width".to_string());
        }
        if self.audio_num_attention_heads != self.num_attention_heads {
            problems.push(format!(
                "{} audio heads but {} video heads (ltx-core requires them equal)",
                self.audio_num_attention_heads, self.num_attention_heads
            ));
        }
        if self.audio_positional_embedding_max_pos.len() != 1 {
            problems.push("audio_positional_embedding_max_pos needs one axis (time)".into());
        }
        if self.audio_cross_attention_dim != self.audio_inner_dim() {
            problems.push(format!(
                "audio_cross_attention_dim {} differs from the audio model width {}",
                self.audio_cross_attention_dim,
                self.audio_inner_dim()
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            candle_core::bail!(
                "LTX-2 transformer config (audio stream): {}",
                problems.join("; ")
            )
        }
    }

    /// Rows of a block's `scale_shift_table` and of the AdaLN output per width: 6, or 9 with the cross-attention
    /// AdaLN.
    pub fn adaln_coefficient(&self) -> usize {
        if self.cross_attention_adaln {
            9
        } else {
            6
        }
    }

    /// Whether the transformer holds the caption projection (`caption_projection.linear_1` / `linear_2`).
    pub fn has_caption_projection(&self) -> bool {
        !self.caption_proj_before_connector
    }

    /// Checks what this implementation covers, collecting every problem: the split RoPE at patch middles over
    /// three axes, RMSNorm q/k norms, GELU-tanh, no shared feed-forward, heads that divide the RoPE table, the
    /// text width equal to the model width, the caption width where the transformer projects it.
    pub fn validate(&self) -> candle_core::Result<()> {
        let mut problems = Vec::new();
        if self.num_attention_heads == 0 || self.attention_head_dim % 2 != 0 {
            problems.push("attention heads must exist and have an even width".to_string());
        }
        if self.rope_type != "split" {
            problems.push(format!(
                "RoPE type `{}` (only `split` is supported)",
                self.rope_type
            ));
        }
        if !self.use_middle_indices_grid {
            problems.push("use_middle_indices_grid = false (every release has true)".into());
        }
        if self.positional_embedding_max_pos.len() != 3 {
            problems
                .push("positional_embedding_max_pos needs three axes (time, height, width)".into());
        }
        let expect = |key: &str, got: &Option<String>, want: &str, out: &mut Vec<String>| {
            if got.as_deref().is_some_and(|g| g != want) {
                out.push(format!("{key} = {got:?}, expected `{want}`"));
            }
        };
        expect("qk_norm", &self.qk_norm, "rms_norm", &mut problems);
        expect(
            "standardization_norm",
            &self.standardization_norm,
            "rms_norm",
            &mut problems,
        );
        expect(
            "activation_fn",
            &self.activation_fn,
            "gelu-approximate",
            &mut problems,
        );
        if self.norm_elementwise_affine == Some(true) || self.share_ff == Some(true) {
            problems.push("norm_elementwise_affine / share_ff set (no release has them)".into());
        }
        if self.cross_attention_dim != self.inner_dim() {
            problems.push(format!(
                "cross_attention_dim {} differs from the model width {}",
                self.cross_attention_dim,
                self.inner_dim()
            ));
        }
        if self.has_caption_projection() && self.caption_channels.is_none() {
            problems
                .push("the transformer projects captions but caption_channels is missing".into());
        }
        if problems.is_empty() {
            Ok(())
        } else {
            candle_core::bail!("LTX-2 transformer config: {}", problems.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(transformer: serde_json::Value) -> BTreeMap<String, String> {
        let config = serde_json::json!({ "transformer": transformer, "vae": {} });
        BTreeMap::from([("config".to_string(), config.to_string())])
    }

    #[test]
    fn releases_are_told_apart_by_their_switches() -> anyhow::Result<()> {
        assert_eq!(Ltx2Config::ltx2_19b().version(), Ltx2Version::Ltx2);
        assert_eq!(Ltx2Config::ltx23_22b().version(), Ltx2Version::Ltx23);
        Ltx2Config::ltx2_19b().validate()?;
        Ltx2Config::ltx23_22b().validate()?;
        let ltx2 = metadata(serde_json::json!({"caption_channels": 3840, "num_layers": 48}));
        let (cfg, version) =
            Ltx2Config::from_metadata(&ltx2).ok_or_else(|| anyhow::anyhow!("none"))??;
        assert_eq!(
            (version, cfg.inner_dim(), cfg.adaln_coefficient()),
            (Ltx2Version::Ltx2, 4096, 6)
        );
        let ltx23 = metadata(serde_json::json!({
            "apply_gated_attention": true, "cross_attention_adaln": true, "caption_proj_before_connector": true,
            "av_ca_timestep_scale_multiplier": 1000.0, "connector_num_layers": 8
        }));
        let (cfg, version) =
            Ltx2Config::from_metadata(&ltx23).ok_or_else(|| anyhow::anyhow!("none"))??;
        assert_eq!((version, cfg.adaln_coefficient()), (Ltx2Version::Ltx23, 9));
        assert!(!cfg.has_caption_projection());
        assert!(Ltx2Config::from_metadata(&BTreeMap::new()).is_none());
        Ok(())
    }

    #[test]
    fn unsupported_switches_are_all_named() -> anyhow::Result<()> {
        let cfg = Ltx2Config::from_transformer_json(&serde_json::json!({
            "rope_type": "interleaved", "qk_norm": "layer_norm", "share_ff": true
        }))?;
        let message = cfg
            .validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        for part in ["interleaved", "qk_norm", "share_ff", "caption_channels"] {
            assert!(message.contains(part), "{message} lacks {part}");
        }
        Ok(())
    }
}
