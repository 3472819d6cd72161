//! The subcommands of `framesmith-bench`, a file per family of benchmarks: their arguments and what each runs.

pub(crate) mod audio;
pub(crate) mod ops;
pub(crate) mod step;
pub(crate) mod stream;
pub(crate) mod synth;
