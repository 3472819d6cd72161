//! Video: H.264 MP4 encoding of sample clips and the frames the in-app player shows.

pub mod encode;
