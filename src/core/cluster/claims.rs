//! The claims bucket: this relay's claim records (one per session its emitters claim)
//! and presence record, refreshed every third of the claim TTL, and the other relays'
//! records as the bucket reports them.

use super::Bus;
use crate::cluster::{self, ToBus};
use crate::core::Core;
use crate::wire::ws::aep;
use bytes::Bytes;
use serde_json::{json, Value};
use std::time::Instant;

/// A remote claim record: one relay's claimants of one session.
#[derive(Debug, Clone)]
pub(super) struct RemoteClaim {
    relay: String,
    session: String,
    /// Roster entries (AEP-0003 §4.1), one per claimant there.
    entries: Vec<Value>,
    /// Each claimant's declared `control.accepts`.
    accepts: Vec<Vec<String>>,
}

impl Bus {
    /// This relay's presence record, put in the claims bucket under a three-part key
    /// (claim keys have two), so relays see each other without a protocol of their own.
    pub(super) fn put_presence(&mut self) {
        let mut v = self.health();
        v["presence"] = true.into();
        let key = cluster::kv_key(&["relay", &self.config.relay_id, "presence"]);
        let value = Bytes::from(serde_json::to_vec(&v).unwrap_or_default());
        self.to_bus.push_back(ToBus::PutClaim { key, value });
    }

    /// Every relay of the cluster as this one knows it, itself first (`/status`).
    fn relays(&self) -> Vec<Value> {
        let mut own = self.health();
        own["self"] = true.into();
        std::iter::once(own)
            .chain(self.relays.values().cloned())
            .collect()
    }

    /// The declared `agent` of every remote claimant of `session` (`None`: it declared
    /// none), from their roster entries.
    pub(in crate::core) fn remote_claimant_agents(&self, session: &str) -> Vec<Option<String>> {
        self.remote
            .values()
            .filter(|r| r.session == session)
            .flat_map(|r| r.entries.iter())
            .map(|e| e.get("agent").and_then(Value::as_str).map(str::to_owned))
            .collect()
    }

    /// Remote claimants of `session` (relay, accepts of each).
    pub(super) fn remote_claimants(&self, session: &str) -> Vec<(&str, &[String])> {
        let mut v: Vec<(&str, &[String])> = self
            .remote
            .values()
            .filter(|r| r.session == session)
            .flat_map(|r| r.accepts.iter().map(move |a| (r.relay.as_str(), &a[..])))
            .collect();
        v.sort_unstable();
        v
    }

    /// A claims KV entry changed ([`FromBus::Claim`]): another relay's presence record
    /// or claim record kept, this relay's own ignored, a gone one forgotten.
    ///
    /// [`FromBus::Claim`]: crate::cluster::FromBus::Claim
    pub(super) fn on_claim(&mut self, key: String, value: Option<Bytes>) {
        let own = self.config.relay_id.clone();
        let presence = value
            .as_deref()
            .and_then(|b| serde_json::from_slice::<Value>(b).ok())
            .filter(|v| v.get("presence").and_then(Value::as_bool) == Some(true));
        if let Some(p) = presence {
            if p.get("relay").and_then(Value::as_str) != Some(own.as_str()) {
                self.relays.insert(key, p);
            }
            return;
        }
        match value.as_deref().and_then(parse_claim) {
            Some(c) if c.relay != own => {
                self.remote.insert(key, c);
            }
            Some(_) => {}
            None => {
                self.remote.remove(&key);
                // A presence record gone: the relay stopped refreshing it.
                self.relays.remove(&key);
            }
        }
    }
}

/// A claim record's value: `{"relay","session","entries","accepts"}`.
fn claim_record(relay: &str, session: &str, entries: &[Value], accepts: &[Vec<String>]) -> Bytes {
    let v = json!({ "relay": relay, "session": session, "entries": entries, "accepts": accepts });
    Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
}

fn parse_claim(b: &[u8]) -> Option<RemoteClaim> {
    let v: Value = serde_json::from_slice(b).ok()?;
    let accepts = v
        .get("accepts")?
        .as_array()?
        .iter()
        .map(|a| {
            a.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|t| t.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect();
    Some(RemoteClaim {
        relay: v.get("relay")?.as_str()?.to_owned(),
        session: v.get("session")?.as_str()?.to_owned(),
        entries: v.get("entries")?.as_array()?.clone(),
        accepts,
    })
}

impl Core {
    /// The claim refresh, when due (from [`Core::handle_timeout`]).
    pub(in crate::core) fn bus_timeout(&mut self, now: Instant) {
        // A rebuild deferred behind a replay in progress.
        self.settle_provisional();
        let Some(bus) = self.bus.as_mut() else {
            return;
        };
        if bus.refresh_at.is_some_and(|t| t <= now) {
            bus.refresh_at = Some(now + bus.config.claim_ttl / 3);
            bus.flush_outbox();
            if bus.connected() {
                bus.put_presence();
                let sessions: Vec<String> = self.claims.iter().map(|(s, _)| s.to_owned()).collect();
                self.bus
                    .as_mut()
                    .expect("clustered")
                    .claims_dirty
                    .extend(sessions);
            }
        }
    }

    /// The next cluster deadline (the claim refresh).
    pub(in crate::core) fn bus_deadline(&self) -> Option<Instant> {
        self.bus.as_ref()?.refresh_at
    }

    /// Marks `session`'s local claim record for a put (or a delete once unclaimed).
    pub(in crate::core) fn claim_changed(&mut self, session: &str) {
        if let Some(bus) = self.bus.as_mut() {
            bus.claims_dirty.insert(session.to_owned());
        }
    }

    pub(super) fn put_claim(&mut self, session: &str) {
        let mut entries = Vec::new();
        let mut accepts = Vec::new();
        for c in self.claims.claimants(session) {
            if let Some(d) = self.ws_state(*c).and_then(|w| w.hello.as_deref()) {
                entries.push(aep::roster_entry(session, d));
                accepts.push(d.accepts.clone().unwrap_or_default());
            }
        }
        let Some(bus) = self.bus.as_mut() else {
            return;
        };
        let key = cluster::kv_key(&[&bus.config.relay_id, session]);
        if entries.is_empty() {
            bus.to_bus.push_back(ToBus::DeleteClaim { key });
        } else {
            let value = claim_record(&bus.config.relay_id, session, &entries, &accepts);
            bus.to_bus.push_back(ToBus::PutClaim { key, value });
        }
    }

    /// The cluster's relays for `/status` (`None` for a single relay).
    pub(in crate::core) fn cluster_status(&self) -> Option<Value> {
        let bus = self.bus.as_ref()?;
        let mut v = bus.health();
        v["relays"] = bus.relays().into();
        Some(v)
    }

    /// Roster entries of the claimants on other relays (AEP-0003 §4.1), by session.
    pub(in crate::core) fn remote_roster(&self) -> Vec<(String, Value)> {
        let Some(bus) = self.bus.as_ref() else {
            return Vec::new();
        };
        let mut v: Vec<(String, Value)> = bus
            .remote
            .values()
            .flat_map(|r| r.entries.iter().map(|e| (r.session.clone(), e.clone())))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}
