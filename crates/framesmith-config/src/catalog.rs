//! The model variants a run config may name (`model.variant`): the name users type and the number of DiT blocks,
//! which validation needs to check `memory.blocks_to_swap`. Plain data: the architectures themselves live with
//! the models, and a test in the engine checks every name here resolves to a model with this many blocks.

/// One named model variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    /// The command-line and config name (`t2v-14b`).
    pub name: &'static str,
    /// DiT blocks (what block streaming counts).
    pub blocks: usize,
}

/// Every named variant, in the order messages list them.
pub const VARIANTS: &[Variant] = &[
    Variant {
        name: "t2v-1.3b",
        blocks: 30,
    },
    Variant {
        name: "t2v-14b",
        blocks: 40,
    },
    Variant {
        name: "i2v-14b",
        blocks: 40,
    },
    Variant {
        name: "t2v-a14b",
        blocks: 40,
    },
    Variant {
        name: "i2v-a14b",
        blocks: 40,
    },
    Variant {
        name: "ti2v-5b",
        blocks: 30,
    },
];

/// The variant called `name` (any case).
pub fn variant(name: &str) -> Option<&'static Variant> {
    VARIANTS.iter().find(|v| v.name.eq_ignore_ascii_case(name))
}

/// The names of [`VARIANTS`], comma-separated (for "use one of …" messages).
pub fn variant_names() -> String {
    VARIANTS
        .iter()
        .map(|v| v.name)
        .collect::<Vec<_>>()
        .join(", ")
}
