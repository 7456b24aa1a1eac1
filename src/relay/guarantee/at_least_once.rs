//! `relay.delivery = "at-least-once"` (the default): everything after the slot's confirmed
//! position is published again after a crash or reconnect; consumers deduplicate on the `id`
//! header. The trait's defaults are this strategy: admit everything, stamp nothing, hold
//! nothing.

use super::Guarantee;

pub(super) struct AtLeastOnce;

impl Guarantee for AtLeastOnce {
    fn label(&self) -> &'static str {
        "at-least-once"
    }
}
