//! Generation: the flow-matching sampling loop with its solvers (`denoise`, `sampler`), whole clips from a prompt
//! with loaded models (`pipeline`), the start image of image-to-video clips, and sample prompt files.

pub mod denoise;
pub mod pipeline;
pub mod prompts;
pub mod sampler;
pub mod start_image;
