//! "none": no congestion control, a fixed window at line rate.

use crate::types::{AckEvent, Actions, PathConfig};
use crate::{CcKind, CongestionControl, RxDataEvent, SendEvent};

/// Parameters of the fixed-window "none" CC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoCcConfig {
    /// Line rate (the pacing rate).
    pub path: PathConfig,
    /// Fixed window in bytes; `None` = unlimited (`u64::MAX`). Default unlimited, as a
    /// plain RoCEv2 NIC without CC.
    pub window_bytes: Option<u64>,
}

impl Default for NoCcConfig {
    fn default() -> Self {
        Self::for_path(PathConfig::default())
    }
}

impl NoCcConfig {
    /// Defaults for a given path.
    pub fn for_path(path: PathConfig) -> Self {
        NoCcConfig {
            path,
            window_bytes: None,
        }
    }
}

/// Fixed window, line rate, ignores every event.
#[derive(Clone, Debug)]
pub struct NoCc {
    window: u64,
    rate: u64,
}

impl NoCc {
    /// New instance.
    pub fn new(cfg: &NoCcConfig) -> Self {
        NoCc {
            window: cfg.window_bytes.unwrap_or(u64::MAX).max(1),
            rate: cfg.path.sanitized().line_rate_bps,
        }
    }
}

impl CongestionControl for NoCc {
    fn on_send(&mut self, _ev: &SendEvent) -> Actions {
        Actions::NONE
    }
    fn on_ack(&mut self, _ev: &AckEvent<'_>) -> Actions {
        Actions::NONE
    }
    fn on_rx_data(&mut self, _ev: &RxDataEvent<'_>) -> Actions {
        Actions::NONE
    }
    fn window_bytes(&self) -> u64 {
        self.window
    }
    fn rate_bps(&self) -> u64 {
        self.rate
    }
    fn kind(&self) -> CcKind {
        CcKind::None
    }
}
