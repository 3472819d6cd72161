//! Field lists: how each key of the run config and of a musubi-tuner dataset config is labelled and edited.
//! A family's own settings come from the config crate's list of them ([`framesmith_config::family_settings`]).
//! Keys missing here still appear in the form (under "Other settings"), edited by their value type.

use std::sync::LazyLock;

use super::form::{FieldKind, FieldSpec};

const fn field(key: &'static str, label: &'static str, kind: FieldKind) -> FieldSpec<'static> {
    FieldSpec {
        key,
        label,
        kind,
        optional: false,
        help: "",
    }
}

const fn optional(key: &'static str, label: &'static str, kind: FieldKind) -> FieldSpec<'static> {
    FieldSpec {
        key,
        label,
        kind,
        optional: true,
        help: "",
    }
}

const fn help(spec: FieldSpec<'static>, help: &'static str) -> FieldSpec<'static> {
    FieldSpec { help, ..spec }
}

const DTYPES: &[&str] = &["f32", "bf16", "f16", "fp8"];
const FP8_SCALES: &[&str] = &framesmith_config::run::Fp8ScaleMode::NAMES;
const RESIDUALS: &[&str] = &["f32", "bf16"];
const EXPERT_MODES: &[&str] = &["joint", "split"];
const TRAINING_MODES: &[&str] = &framesmith_config::run::TrainingMode::NAMES;
const SCHEDULERS: &[&str] = &[
    "constant",
    "constant_with_warmup",
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
];
const TIMESTEPS: &[&str] = &framesmith_config::run::TimestepSampling::NAMES;
const WEIGHTINGS: &[&str] = &["none", "sigma_sqrt", "cosmap"];
const STREAMING: &[&str] = &["off", "pinned", "staged", "auto"];
const PLACEMENTS: &[&str] = &["device", "host", "pinned", "pageable", "auto"];
const CHECKPOINTING: &[&str] = &["blocks", "attention", "attention_projection", "off", "auto"];
const LORA_KINDS: &[&str] = &["lora", "lokr", "loha", "dora"];
const SAVE_DTYPES: &[&str] = &["fp32", "bf16", "fp16", "dit"];
const FRAME_EXTRACTION: &[&str] = &["head", "chunk", "slide", "uniform", "full"];

/// A titled group of run-config fields.
pub struct Section {
    pub title: &'static str,
    pub fields: &'static [FieldSpec<'static>],
}

/// Every run-config key, grouped as the form shows them.
pub const RUN_SECTIONS: &[Section] = &[
    Section {
        title: "Model",
        fields: &[
            help(
                field("model.demo", "Demo model", FieldKind::Bool),
                "Train the built-in tiny model: no downloads, no GPU",
            ),
            field("model.dit", "DiT", FieldKind::Path),
            field("model.vae", "VAE", FieldKind::Path),
            field("model.text_encoder", "Text encoder", FieldKind::Path),
            help(
                field("model.clip", "CLIP", FieldKind::Path),
                "Image-to-video models with an image encoder (CLIP or SigLIP): encodes the start images of samples",
            ),
            help(
                field("model.variant", "Variant", FieldKind::Text),
                "auto, t2v-1.3b, t2v-14b, i2v-14b, t2v-a14b, i2v-a14b, ti2v-5b",
            ),
            help(
                field("model.dit_low_noise", "Low-noise expert", FieldKind::Path),
                "Models of two experts: set it to train both in one run (DiT is then the high-noise expert)",
            ),
            help(
                field("model.experts", "Experts", FieldKind::Choice(EXPERT_MODES)),
                "joint: one LoRA shared by both experts, as musubi-tuner trains it. split: one LoRA per expert, \
                 saved as _high_noise and _low_noise",
            ),
            help(
                field("model.expert_boundary", "Expert boundary", FieldKind::Float),
                "Where the low-noise expert takes over, as a fraction of the timesteps; 0 uses the model's \
                 (0.875 text-to-video, 0.9 image-to-video)",
            ),
            field("model.base_dtype", "Base dtype", FieldKind::Choice(DTYPES)),
            field(
                "model.fp8_scale",
                "FP8 scale",
                FieldKind::Choice(FP8_SCALES),
            ),
            field(
                "model.residual_dtype",
                "Residual dtype",
                FieldKind::Choice(RESIDUALS),
            ),
            help(
                field("model.fp8_matmul", "FP8 matrix products", FieldKind::Bool),
                "FP8 base only, Hopper GPUs: the block linears multiply on FP8 tensor cores (faster, less exact; \
                 the base is held with per-channel scales)",
            ),
            help(
                field("model.fp8_attention", "FP8 attention", FieldKind::Bool),
                "Hopper GPUs or newer: attention forward and backward in FP8 through cuDNN (faster, less exact; \
                 recorded in the LoRA)",
            ),
        ],
    },
    Section {
        title: "Dataset",
        fields: &[
            help(
                field("dataset.config", "Dataset config", FieldKind::Path),
                "A musubi-tuner dataset TOML; left empty, the dataset built in the Project tab is used",
            ),
            help(
                field("dataset.synthetic", "Synthetic data", FieldKind::Bool),
                "Train on generated latents and text embeddings (the demo model, smoke tests)",
            ),
            help(
                optional("dataset.resolution", "Resolution override", FieldKind::Ints),
                "Width, height for every dataset",
            ),
            help(
                optional(
                    "dataset.target_frames",
                    "Target frames override",
                    FieldKind::Ints,
                ),
                "Frame counts for every video dataset, each 4k+1",
            ),
            help(
                field(
                    "dataset.skip_unreadable",
                    "Skip unreadable files",
                    FieldKind::Bool,
                ),
                "Leave out, with a counted warning, dataset files that cannot be read (a link to an unplugged \
                 drive, an image that does not decode) instead of stopping until they are fixed or removed",
            ),
        ],
    },
    Section {
        title: "LoRA",
        fields: &[
            help(
                field("lora.kind", "Kind", FieldKind::Choice(LORA_KINDS)),
                "lora: plain LoRA; lokr: Kronecker factors (LyCORIS LoKr); loha: Hadamard product of two \
                 low-rank products (LoHa); dora: a LoRA with a trained magnitude per output (DoRA)",
            ),
            field("lora.rank", "Rank", FieldKind::Int),
            field("lora.alpha", "Alpha", FieldKind::Float),
            help(
                field("lora.factor", "LoKr factor", FieldKind::Int),
                "LoKr: the largest factor of each width given to w1; -1 picks the most square split",
            ),
            help(
                field("lora.decompose_both", "LoKr: decompose w1 too", FieldKind::Bool),
                "LoKr: w1 too as a product of two rank-sized factors where that is smaller",
            ),
            help(
                field("lora.full_matrix", "LoKr: full matrices", FieldKind::Bool),
                "LoKr: w1 and w2 full matrices whatever the rank",
            ),
            field(
                "lora.include_patterns",
                "Include patterns",
                FieldKind::Strings,
            ),
            field(
                "lora.exclude_patterns",
                "Exclude patterns",
                FieldKind::Strings,
            ),
            optional("lora.init_from", "Start from LoRA", FieldKind::Path),
        ],
    },
    Section {
        title: "Optimizer",
        fields: &[
            field("optimizer.learning_rate", "Learning rate", FieldKind::Float),
            field("optimizer.betas", "Betas", FieldKind::Floats),
            field("optimizer.eps", "Epsilon", FieldKind::Float),
            field("optimizer.weight_decay", "Weight decay", FieldKind::Float),
            help(
                field("optimizer.max_grad_norm", "Max grad norm", FieldKind::Float),
                "0 disables clipping",
            ),
            field(
                "optimizer.lr_scheduler",
                "LR scheduler",
                FieldKind::Choice(SCHEDULERS),
            ),
            field("optimizer.lr_warmup_steps", "Warmup steps", FieldKind::Int),
            field(
                "optimizer.lr_scheduler_num_cycles",
                "Scheduler cycles",
                FieldKind::Int,
            ),
            field(
                "optimizer.lr_scheduler_power",
                "Scheduler power",
                FieldKind::Float,
            ),
        ],
    },
    Section {
        title: "Training",
        fields: &[
            help(
                field("training.mode", "Mode", FieldKind::Choice(TRAINING_MODES)),
                "Text-to-video or image-to-video (the clip's first frame given); auto: the model's own. TI2V-5B does both",
            ),
            field("training.max_train_steps", "Max steps", FieldKind::Int),
            help(
                optional("training.max_train_epochs", "Max epochs", FieldKind::Int),
                "Overrides max steps by whole epochs",
            ),
            field(
                "training.gradient_accumulation_steps",
                "Gradient accumulation",
                FieldKind::Int,
            ),
            field("training.seed", "Seed", FieldKind::Int),
            field(
                "training.timestep_sampling",
                "Timestep sampling",
                FieldKind::Choice(TIMESTEPS),
            ),
            field(
                "training.discrete_flow_shift",
                "Flow shift",
                FieldKind::Float,
            ),
            field("training.sigmoid_scale", "Sigmoid scale", FieldKind::Float),
            field("training.min_timestep", "Min timestep", FieldKind::Float),
            field("training.max_timestep", "Max timestep", FieldKind::Float),
            field(
                "training.weighting_scheme",
                "Loss weighting",
                FieldKind::Choice(WEIGHTINGS),
            ),
            help(
                field("training.device", "Device", FieldKind::Text),
                "auto (the first CUDA device, else the CPU), cpu, cuda or cuda:N",
            ),
            help(
                field(
                    "training.low_noise_device",
                    "Low-noise expert's GPU",
                    FieldKind::Text,
                ),
                "Two experts in one run: cuda:N puts the low-noise expert on that GPU, each expert resident \
                 on its own card; empty shares the Device, one expert at a time",
            ),
            field("training.logit_mean", "LogSNR mean", FieldKind::Float),
            field("training.logit_std", "LogSNR std", FieldKind::Float),
            help(
                field(
                    "training.preserve_distribution_shape",
                    "Preserve distribution shape",
                    FieldKind::Bool,
                ),
                "Keep the timestep distribution's shape inside the range by rejection instead of scaling",
            ),
            help(
                optional(
                    "training.first_frame_conditioning_p",
                    "First-frame conditioning",
                    FieldKind::Float,
                ),
                "The probability that a clip's first frame is given clean, as image-to-video conditioning \
                 (models trained that way); empty: the model's official default",
            ),
            help(
                field(
                    "training.max_consecutive_nonfinite",
                    "Stop after non-finite steps",
                    FieldKind::Int,
                ),
                "Stop the run after this many NaN/inf steps in a row",
            ),
        ],
    },
    Section {
        title: "Memory",
        fields: &[
            field(
                "memory.streaming",
                "Streaming",
                FieldKind::Choice(STREAMING),
            ),
            help(
                field(
                    "memory.blocks_to_swap",
                    "Blocks to stream",
                    FieldKind::IntOrAuto,
                ),
                "A count, or auto to let the planner pick",
            ),
            field(
                "memory.activations",
                "Activations",
                FieldKind::Choice(PLACEMENTS),
            ),
            help(
                field(
                    "memory.checkpointing",
                    "Checkpointing",
                    FieldKind::Choice(CHECKPOINTING),
                ),
                "blocks: recompute each block in the backward (least memory); attention: also keep \
                 self-attention outputs (faster, a few GB more); attention_projection: also keep their \
                 projection (as much again, a little faster); off: keep everything (fastest, most memory); \
                 auto: the most kept that fits the VRAM and RAM budgets",
            ),
            help(
                optional(
                    "memory.vram_budget_gb",
                    "VRAM budget (GB)",
                    FieldKind::Float,
                ),
                "Empty: the card's free memory minus headroom",
            ),
            help(
                optional(
                    "memory.ram_budget_gb",
                    "RAM budget (GB)",
                    FieldKind::Float,
                ),
                "Empty: what the machine can give without swapping when the run starts",
            ),
            field("memory.staging_slots", "Staging slots", FieldKind::Int),
            help(
                field(
                    "memory.shared_memory_guard",
                    "Shared-memory guard",
                    FieldKind::Bool,
                ),
                "Warn and pause when Windows starts spilling into shared GPU memory",
            ),
        ],
    },
    Section {
        title: "Output",
        fields: &[
            field("output.output_dir", "Output folder", FieldKind::Folder),
            field("output.output_name", "Output name", FieldKind::Text),
            optional(
                "output.save_every_n_steps",
                "Save every n steps",
                FieldKind::Int,
            ),
            optional(
                "output.save_every_n_epochs",
                "Save every n epochs",
                FieldKind::Int,
            ),
            field("output.save_state", "Save resumable state", FieldKind::Bool),
            field(
                "output.save_dtype",
                "LoRA dtype",
                FieldKind::Choice(SAVE_DTYPES),
            ),
        ],
    },
    Section {
        title: "Sampling",
        fields: &[
            optional("sampling.prompts", "Sample prompts", FieldKind::Path),
            optional(
                "sampling.sample_every_n_steps",
                "Sample every n steps",
                FieldKind::Int,
            ),
            optional(
                "sampling.sample_every_n_epochs",
                "Sample every n epochs",
                FieldKind::Int,
            ),
            field(
                "sampling.sample_at_first",
                "Sample before training",
                FieldKind::Bool,
            ),
        ],
    },
    Section {
        title: "Validation",
        fields: &[
            help(
                optional(
                    "validation.validate_every_n_steps",
                    "Validate every n steps",
                    FieldKind::Int,
                ),
                "Loss on held-out data: the dataset config's [[validation_datasets]] or the split below",
            ),
            optional(
                "validation.validate_every_n_epochs",
                "Validate every n epochs",
                FieldKind::Int,
            ),
            field(
                "validation.validate_at_save",
                "Validate at each save",
                FieldKind::Bool,
            ),
            help(
                field(
                    "validation.validation_split",
                    "Held-out fraction",
                    FieldKind::Float,
                ),
                "Fraction of the training items held out (never trained on), e.g. 0.1; 0 for none",
            ),
            help(
                optional(
                    "validation.validation_seed",
                    "Validation seed",
                    FieldKind::Int,
                ),
                "Chooses the held-out items and the fixed noise; unset: the training seed",
            ),
            help(
                field(
                    "validation.num_timesteps",
                    "Validation timesteps",
                    FieldKind::Int,
                ),
                "Fixed timesteps each item is evaluated at, spread over the training range",
            ),
        ],
    },
];

/// The fields the families' own settings add, with the title of the section each goes in.
static FAMILY_FIELDS: LazyLock<Vec<(&'static str, FieldSpec<'static>)>> = LazyLock::new(|| {
    framesmith_config::family_settings()
        .map(|s| {
            let spec = field(s.key, s.label, FieldKind::Choice(s.choices));
            (s.section, help(spec, s.help))
        })
        .collect()
});

/// The fields of `section`: its own, then those the families' settings add to it.
pub fn section_fields(section: &Section) -> impl Iterator<Item = &'static FieldSpec<'static>> {
    let title = section.title;
    let own: &'static [FieldSpec<'static>] = section.fields;
    own.iter().chain(
        FAMILY_FIELDS
            .iter()
            .filter(move |(s, _)| *s == title)
            .map(|(_, spec)| spec),
    )
}

/// The spec of a run-config key, if the form knows it.
pub fn run_field(key: &str) -> Option<&'static FieldSpec<'static>> {
    RUN_SECTIONS
        .iter()
        .flat_map(section_fields)
        .find(|f| f.key == key)
}

/// musubi-tuner `[general]` keys.
pub const DATASET_GENERAL: &[FieldSpec<'static>] = &[
    help(
        optional("resolution", "Resolution", FieldKind::Ints),
        "Width, height",
    ),
    optional("caption_extension", "Caption extension", FieldKind::Text),
    optional("batch_size", "Batch size", FieldKind::Int),
    optional("num_repeats", "Repeats", FieldKind::Int),
    optional("enable_bucket", "Buckets", FieldKind::Bool),
    optional(
        "bucket_no_upscale",
        "No upscale in buckets",
        FieldKind::Bool,
    ),
];

/// musubi-tuner `[[datasets]]` keys (each may also override a `[general]` key).
pub const DATASET_ENTRY: &[FieldSpec<'static>] = &[
    optional("image_directory", "Image folder", FieldKind::Folder),
    optional("video_directory", "Video folder", FieldKind::Folder),
    optional("cache_directory", "Cache folder", FieldKind::Folder),
    optional("num_repeats", "Repeats", FieldKind::Int),
    help(
        optional("target_frames", "Target frames", FieldKind::Ints),
        "Frame counts cut from each video, e.g. 1, 25, 45",
    ),
    optional(
        "frame_extraction",
        "Frame extraction",
        FieldKind::Choice(FRAME_EXTRACTION),
    ),
    optional("frame_stride", "Frame stride", FieldKind::Int),
    optional("frame_sample", "Frame samples", FieldKind::Int),
    optional("max_frames", "Max frames", FieldKind::Int),
    optional("source_fps", "Source fps", FieldKind::Float),
    optional("resolution", "Resolution", FieldKind::Ints),
    optional("batch_size", "Batch size", FieldKind::Int),
];

/// A form kind for a value whose key has no spec.
pub fn kind_of_value(value: &toml::Value) -> FieldKind {
    match value {
        toml::Value::Boolean(_) => FieldKind::Bool,
        toml::Value::Integer(_) => FieldKind::Int,
        toml::Value::Float(_) => FieldKind::Float,
        toml::Value::Array(items) => match items.first() {
            Some(toml::Value::Integer(_)) => FieldKind::Ints,
            Some(toml::Value::Float(_)) => FieldKind::Floats,
            _ => FieldKind::Strings,
        },
        _ => FieldKind::Text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::form::flatten;
    use framesmith_config::RunConfig;

    #[test]
    fn every_default_key_has_a_field_and_every_field_is_a_key() {
        let mut config = RunConfig::default();
        // Fill the optional keys so that they appear in the serialized table.
        config.training.max_train_epochs = Some(1);
        config.training.first_frame_conditioning_p = Some(0.1);
        config.memory.vram_budget_gb = Some(20.0);
        config.memory.ram_budget_gb = Some(28.0);
        config.output.save_every_n_steps = Some(100);
        config.sampling.prompts = Some("p.txt".into());
        config.sampling.sample_every_n_steps = Some(100);
        config.sampling.sample_every_n_epochs = Some(1);
        config.lora.init_from = Some("l.safetensors".into());
        config.dataset.resolution = Some([832, 480]);
        config.dataset.target_frames = Some(vec![1, 25]);
        config.validation.validate_every_n_steps = Some(100);
        config.validation.validate_every_n_epochs = Some(1);
        config.validation.validation_seed = Some(7);
        let table = crate::config_editor::to_table(&config);
        let keys = flatten(&table);
        for key in keys.keys().filter(|k| *k != "schema_version") {
            assert!(run_field(key).is_some(), "no form field for {key}");
        }
        for field in RUN_SECTIONS.iter().flat_map(section_fields) {
            assert!(
                keys.contains_key(field.key),
                "{} is not a RunConfig key",
                field.key
            );
        }
    }
}
