//! Fixture cases of `shared/fixtures/flux` for the FLUX tests ([`FixtureCase`], read by name), and the
//! element-wise tolerance check (shared with every family's fixtures).

use std::ops::{Deref, DerefMut};

pub use crate::fixtures::assert_close;
use crate::fixtures::{case_dir, FixtureCase};

/// One case of `shared/fixtures/flux`, read on the CPU.
pub struct Case(pub FixtureCase);

impl Case {
    /// Reads the case `name`.
    pub fn load(name: &str) -> anyhow::Result<Self> {
        FixtureCase::load_dir(&case_dir("flux", name)).map(Self)
    }
}

impl Deref for Case {
    type Target = FixtureCase;

    fn deref(&self) -> &FixtureCase {
        &self.0
    }
}

impl DerefMut for Case {
    fn deref_mut(&mut self) -> &mut FixtureCase {
        &mut self.0
    }
}
