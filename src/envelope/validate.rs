//! AEP-0001 envelope validation (stub: to be written).
use super::{Event, InvalidEvent};

/// Envelope versions this relay speaks (major.minor), AEP-0001 §5.1 #1.
pub const SUPPORTED_VERSIONS: [&str; 1] = ["0.1"];

/// Whether `name` is a legal extension attribute name (AEP-0001 §5.4): `[a-z0-9]{1,20}`
/// and not a core attribute name.
pub fn is_valid_extension_name(name: &str) -> bool {
    (1..=20).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && !super::CORE_NAMES.contains(&name)
}

pub(crate) fn validate(ev: &Event) -> Result<(), InvalidEvent> {
    let _ = ev;
    Ok(())
}
