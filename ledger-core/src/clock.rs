//! Time, passed in: the store reads a [`Clock`], so tests can move it by hand.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use crate::domain::Timestamp;

pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> Timestamp;
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp(chrono::Utc::now().timestamp_millis())
    }
}

/// A clock that moves only when told to; shared by cloning.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    pub fn new(start: Timestamp) -> Self {
        Self(Arc::new(AtomicI64::new(start.millis())))
    }
    pub fn set(&self, t: Timestamp) {
        self.0.store(t.millis(), Ordering::SeqCst);
    }
    /// Moves the clock by `ms`, backwards when negative.
    pub fn advance_ms(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}
