//! What the core reports about itself: `GET /status` (the status page's JSON),
//! `GET /metrics` (Prometheus text), `GET /healthz`, and the capabilities both the
//! discovery document and the WebSocket `hello` declare (AEP-0003 §3.4, §4).

use super::conn::Phase;
use super::{ClusterState, Core, NOT_FOUND};
use crate::auth::{Grant, Scopes};
use crate::envelope;
use crate::metrics::{self, Exposition};
use bytes::Bytes;
use serde::Serialize;
use serde_json::json;

impl Core {
    /// `GET /status`: what the status page shows, as JSON: counts, totals (rates are
    /// the client's deltas), and the 100 most recently written sessions with their
    /// positions.
    pub(super) fn status_json(&self) -> Vec<u8> {
        let (mut http_n, mut sse_n, mut ws_n) = (0u64, 0u64, 0u64);
        for (_, c) in self.conns.iter() {
            match c.phase {
                Phase::Sse { .. } => sse_n += 1,
                Phase::Ws(_) => ws_n += 1,
                _ => http_n += 1,
            }
        }
        let pos = |p: Option<(u64, u64)>| p.map(|(e, s)| json!({"epoch": e, "seq": s}));
        let count = self.store.session_count();
        let recent: Vec<serde_json::Value> = self
            .store
            .sessions()
            .skip(count.saturating_sub(100))
            .map(|s| {
                // One row per owning stream `(source, session)` (AEP-0001 §5.2): two
                // emitters sharing a name are two rows; `source` and `agent` say whose
                // (`null` for a name's stream of foreign Events only).
                json!({
                    "session": s.name,
                    "source": s.source,
                    "agent": s.agent,
                    "events": s.events,
                    "earliest": pos(s.earliest),
                    "latest": pos(s.latest),
                })
            })
            .collect();
        // A 404 is an unknown path (a browser's `/favicon.ico`, a scanner), not a refused
        // Event or request of the protocol: `/metrics` counts it under `not-found`, the
        // status page's refusals leave it out and show it as `not_found`.
        let rejected: serde_json::Map<String, serde_json::Value> = self
            .metrics
            .rejected
            .iter()
            .filter(|(c, _)| *c != NOT_FOUND)
            .map(|(c, n)| (c.to_string(), json!(n)))
            .collect();
        let not_found = self
            .metrics
            .rejected
            .iter()
            .find(|(c, _)| *c == NOT_FOUND)
            .map_or(0, |(_, n)| *n);
        let st = &self.hub.stats;
        let doc = json!({
            "uptime_s": self.uptime().as_secs_f64(),
            "connections": {"total": self.conns.len(), "http": http_n, "sse": sse_n, "ws": ws_n},
            "subscriptions": self.hub.len(),
            "sessions": {"count": count, "recent": recent},
            "buffered_events": self.store.len(),
            // The held Events' own bytes (copied into the buffers' arenas), the sum of
            // their sizes.
            "buffered_bytes": self.store.byte_len(),
            "ingested": self.ingested,
            "deliveries": st.deliveries,
            "dropped": st.dropped.total(),
            "backpressure_disconnects": st.backpressure_disconnects,
            // The memory budget (`null`: none) and what is held against it.
            "memory": {"budget": self.ledger.budget, "used": self.memory_used().total()},
            "rejected": rejected,
            "not_found": not_found,
            // Cluster mode: this relay's state and every relay it knows.
            "cluster": self.cluster_status(),
        });
        serde_json::to_vec(&doc).unwrap_or_default()
    }

    /// The Prometheus exposition of `GET /metrics`.
    pub(super) fn metrics_text(&self) -> String {
        let mut x = Exposition::default();
        x.family(metrics::INGESTED, "counter", "Events ingested, by binding.")
            .sample(
                metrics::INGESTED,
                &[("binding", "http")],
                self.metrics.ingested_http as f64,
            )
            .sample(
                metrics::INGESTED,
                &[("binding", "ws")],
                self.metrics.ingested_ws as f64,
            )
            .sample(
                metrics::INGESTED,
                &[("binding", "jsonl")],
                self.metrics.ingested_jsonl as f64,
            );
        x.family(
            metrics::REJECTED,
            "counter",
            "Requests or Events refused, by reason.",
        );
        for (code, n) in &self.metrics.rejected {
            x.sample(metrics::REJECTED, &[("reason", code)], *n as f64);
        }
        let st = &self.hub.stats;
        x.family(
            metrics::DELIVERIES,
            "counter",
            "Frames delivered to subscribers, by binding.",
        )
        .sample(
            metrics::DELIVERIES,
            &[("binding", "sse")],
            (st.deliveries - st.deliveries_ws) as f64,
        )
        .sample(
            metrics::DELIVERIES,
            &[("binding", "ws")],
            st.deliveries_ws as f64,
        );
        x.family(
            metrics::DROPPED,
            "counter",
            "Events not delivered to slow consumers, by severity (AEP-0003 §8.4: debug past half of --max-output, info past three quarters).",
        )
        .sample(
            metrics::DROPPED,
            &[("severity", "debug")],
            st.dropped.debug as f64,
        )
        .sample(
            metrics::DROPPED,
            &[("severity", "info")],
            st.dropped.info as f64,
        );
        x.family(
            metrics::DISCONNECTS,
            "counter",
            "Consumers disconnected because a notice-or-above Event could not be queued.",
        )
        .sample(
            metrics::DISCONNECTS,
            &[],
            st.backpressure_disconnects as f64,
        );
        x.family(
            metrics::REFUSED_CONNECTIONS,
            "counter",
            "Connections refused at the connection limit.",
        )
        .sample(
            metrics::REFUSED_CONNECTIONS,
            &[],
            self.metrics.refused_connections as f64,
        );
        let (mut http_n, mut sse_n, mut ws_n, mut queued) = (0u64, 0u64, 0u64, 0usize);
        x.family(
            metrics::CONN_DROPPED,
            "counter",
            "Events dropped toward each live connection that had drops (the series ends with the connection).",
        );
        for (key, c) in self.conns.iter() {
            match c.phase {
                Phase::Sse { .. } => sse_n += 1,
                Phase::Ws(_) => ws_n += 1,
                _ => http_n += 1,
            }
            queued += c.out.len();
            if !c.dropped.is_empty() {
                let k = key.to_string();
                let peer = c.peer.to_string();
                x.sample(
                    metrics::CONN_DROPPED,
                    &[("conn", &k), ("peer", &peer)],
                    c.dropped.total() as f64,
                );
            }
        }
        x.family(
            metrics::CONNECTIONS,
            "gauge",
            "Open connections, by binding.",
        )
        .sample(metrics::CONNECTIONS, &[("binding", "http")], http_n as f64)
        .sample(metrics::CONNECTIONS, &[("binding", "sse")], sse_n as f64)
        .sample(metrics::CONNECTIONS, &[("binding", "ws")], ws_n as f64);
        x.family(metrics::SUBSCRIPTIONS, "gauge", "Live subscriptions.")
            .sample(metrics::SUBSCRIPTIONS, &[], self.hub.len() as f64);
        x.family(
            metrics::SESSIONS,
            "gauge",
            "Sessions held in the replay store, one per owning stream (source, session).",
        )
        .sample(metrics::SESSIONS, &[], self.store.session_count() as f64);
        x.family(
            metrics::BUFFERED_EVENTS,
            "gauge",
            "Events held in the replay store.",
        )
        .sample(metrics::BUFFERED_EVENTS, &[], self.store.len() as f64);
        x.family(
            metrics::BUFFERED_BYTES,
            "gauge",
            "Bytes the Events held in the replay store retain (each Event's own bytes: a held Event never keeps its batch body alive).",
        )
        .sample(metrics::BUFFERED_BYTES, &[], self.store.byte_len() as f64);
        x.family(
            metrics::QUEUED_BYTES,
            "gauge",
            "Bytes queued for output across all connections.",
        )
        .sample(metrics::QUEUED_BYTES, &[], queued as f64);
        if let Some(budget) = self.ledger.budget {
            x.family(
                metrics::MEMORY_BUDGET,
                "gauge",
                "The memory budget in bytes (--max-memory, or half the cgroup limit or physical memory).",
            )
            .sample(metrics::MEMORY_BUDGET, &[], budget as f64);
        }
        x.family(
            metrics::MEMORY_USED,
            "gauge",
            "Bytes held against the memory budget, by part (shared frames counted once; TLS and deflate state estimated).",
        );
        for (part, bytes) in self.memory_used().parts() {
            x.sample(metrics::MEMORY_USED, &[("part", part)], bytes as f64);
        }
        x.family(
            metrics::MEMORY_DROPPED,
            "counter",
            "Consumers dropped because their output queues held the most of an exceeded memory budget.",
        )
        .sample(
            metrics::MEMORY_DROPPED,
            &[],
            self.ledger.dropped_consumers as f64,
        );
        let ev = self.store.evictions();
        x.family(
            metrics::EVICTIONS,
            "counter",
            "Events evicted from the replay store, by reason: ring (--buffer), sessions (--max-sessions), memory (--max-memory).",
        )
        .sample(metrics::EVICTIONS, &[("reason", "ring")], ev.ring as f64)
        .sample(
            metrics::EVICTIONS,
            &[("reason", "sessions")],
            ev.sessions as f64,
        )
        .sample(metrics::EVICTIONS, &[("reason", "memory")], ev.memory as f64);
        x.family(metrics::UPTIME, "gauge", "Seconds since start.")
            .sample(metrics::UPTIME, &[], self.uptime().as_secs_f64());
        x.family(
            metrics::DELIVERY_LATENCY,
            "histogram",
            "Seconds from an Event's fan-out (its ingest; in cluster mode its arrival from the stream) to the write that carried it to the consumer's socket, by binding; sampled, at most one delivery per connection and write batch.",
        )
        .histogram(
            metrics::DELIVERY_LATENCY,
            &[("binding", "sse")],
            &self.metrics.latency_sse,
        )
        .histogram(
            metrics::DELIVERY_LATENCY,
            &[("binding", "ws")],
            &self.metrics.latency_ws,
        );
        x.family(
            metrics::POST_DURATION,
            "histogram",
            "Seconds from a POST /events request's first byte to its answer (in cluster mode, the wait for the engine's acknowledgements included).",
        )
        .histogram(metrics::POST_DURATION, &[], &self.metrics.post_duration);
        if let Some(bus) = &self.bus {
            let state = bus.state();
            x.family(
                metrics::CLUSTER_STATE,
                "gauge",
                "Cluster mode: 1 for the relay's state with the engine.",
            );
            for s in [
                ClusterState::Connected,
                ClusterState::CatchingUp,
                ClusterState::Degraded,
            ] {
                let v = if s == state { 1.0 } else { 0.0 };
                x.sample(metrics::CLUSTER_STATE, &[("state", s.as_str())], v);
            }
            x.family(
                metrics::CLUSTER_LAG,
                "gauge",
                "Cluster mode: stream messages the consumer has yet to deliver.",
            )
            .sample(metrics::CLUSTER_LAG, &[], bus.lag() as f64);
            x.family(
                metrics::CLUSTER_OUTBOX,
                "gauge",
                "Cluster mode: Events ingested while degraded, not yet in the stream.",
            )
            .sample(metrics::CLUSTER_OUTBOX, &[], bus.outbox_len() as f64);
            x.family(
                metrics::CLUSTER_RECONNECTS,
                "counter",
                "Cluster mode: reconnections to the engine.",
            )
            .sample(metrics::CLUSTER_RECONNECTS, &[], bus.reconnects as f64);
            x.family(
                metrics::CLUSTER_CONSUMER_RESETS,
                "counter",
                "Cluster mode: recreations of the ordered consumer.",
            )
            .sample(
                metrics::CLUSTER_CONSUMER_RESETS,
                &[],
                bus.consumer_resets as f64,
            );
            x.family(
                metrics::CLUSTER_PUBLISH_ERRORS,
                "counter",
                "Cluster mode: publishes the engine did not store.",
            )
            .sample(
                metrics::CLUSTER_PUBLISH_ERRORS,
                &[],
                bus.publish_errors as f64,
            );
        }
        x.finish()
    }

    /// `GET /healthz`: `{"ok":true}`, with counts for an authenticated caller.
    pub(super) fn health(&self, detailed: bool) -> Vec<u8> {
        let mut doc = if detailed {
            json!({
                "ok": true,
                "sessions": self.store.session_count(),
                "subscribers": self.hub.len(),
                "connections": self.conns.len(),
                "uptime_s": self.uptime().as_secs(),
            })
        } else {
            json!({ "ok": true })
        };
        // Cluster mode: where the relay stands with the engine, for every caller (a load
        // balancer or an operator's probe reads it unauthenticated).
        if let Some(bus) = &self.bus {
            doc["cluster"] = bus.health();
        }
        serde_json::to_vec(&doc).unwrap_or_default()
    }

    /// The discovery document (AEP-0003 §3.4) with what this relay really does.
    /// Built once: it depends only on the configuration.
    pub(super) fn discovery(&self) -> Bytes {
        self.discovery
            .get_or_init(|| {
                /// AEP-0003 §3.4, in this member order.
                #[derive(Serialize)]
                struct Discovery {
                    aep: [&'static str; envelope::SUPPORTED_VERSIONS.len()],
                    role: &'static str,
                    endpoints: Endpoints,
                    capabilities: Capabilities,
                }
                #[derive(Serialize)]
                struct Endpoints {
                    events: &'static str,
                    stream: &'static str,
                    socket: &'static str,
                }
                let doc = Discovery {
                    aep: envelope::SUPPORTED_VERSIONS,
                    role: "relay",
                    endpoints: Endpoints {
                        events: "/events",
                        stream: "/stream",
                        socket: "/socket",
                    },
                    capabilities: self.capabilities(None),
                };
                Bytes::from(serde_json::to_vec(&doc).unwrap_or_default())
            })
            .clone()
    }

    /// The relay's `hello` frame (AEP-0003 §4) for a socket with `grant` that agreed on
    /// `version`: built once per version and grant kind, then shared.
    pub(super) fn hello_frame(&mut self, version: &'static str, grant: Grant) -> Bytes {
        let routes = grant.authenticated && grant.scopes.contains(Scopes::CONTROL);
        if let Some((_, _, f)) = self
            .hellos
            .iter()
            .find(|(v, r, _)| *v == version && *r == routes)
        {
            return f.clone();
        }
        let f = crate::ws::aep::hello(version, &self.capabilities(Some(grant)));
        self.hellos.push((version, routes, f.clone()));
        f
    }

    /// The relay's capabilities, the one source of both the discovery document
    /// (`grant` `None`, AEP-0003 §3.4) and the WebSocket `hello` (AEP-0003 §4) on a
    /// socket with `grant`: the same facts, except that a socket says whether *its*
    /// credentials may route commands, and declares its per-connection limits.
    pub(super) fn capabilities(&self, grant: Option<Grant>) -> Capabilities {
        let c = &self.config;
        let routes = match grant {
            None => c.auth.enabled(),
            Some(g) => g.authenticated && g.scopes.contains(Scopes::CONTROL),
        };
        Capabilities {
            filters: ["attr-match"],
            replay: ReplayCaps {
                buffer: c.buffer_per_session,
                per: "session",
                sessions: c.max_sessions,
                all: true,
                evicts: "debug-first",
            },
            capture: ["none", "metadata", "redacted", "full"],
            roster: Empty {},
            control: ControlCaps {
                accepts: [],
                routes,
            },
            experimental: Experimental { dropped: Empty {} },
            limits: grant.map(|_| Limits {
                subscriptions: c.max_subscriptions_per_conn,
                from: c.max_from_positions,
                message_bytes: c.max_ws_message_bytes,
            }),
        }
    }
}

/// The `capabilities` object (AEP-0003 §3.4, §4), serialized straight from these
/// fields in this member order: no `Map` is built (a WebSocket's `hello` carries it, and
/// the fuzz targets draw one per input).
#[derive(Debug, Serialize)]
pub(super) struct Capabilities {
    filters: [&'static str; 1],
    replay: ReplayCaps,
    capture: [&'static str; 4],
    roster: Empty,
    control: ControlCaps,
    experimental: Experimental,
    /// Per-connection limits, on a socket's `hello` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    limits: Option<Limits>,
}

/// `experimental` (AEP-0003 §4 rule 6): `dropped`, the WebSocket `dropped` frame a
/// consumer asks for by declaring the same key in its `hello` (`ws::aep::dropped`).
#[derive(Debug, Serialize)]
struct Experimental {
    dropped: Empty,
}

/// `replay`: depth per session, sessions held, `from=all` supported.
#[derive(Debug, Serialize)]
struct ReplayCaps {
    buffer: usize,
    per: &'static str,
    sessions: usize,
    all: bool,
    /// The eviction policy (AEP-0007 §5 item 1): `debug-first`, a full buffer evicts
    /// its oldest `debug` Event before any other, and `replay-exhausted` is owed for an
    /// evicted Event of severity `info` or above (docs/consuming.md).
    evicts: &'static str,
}

/// `control`: the command types accepted (none: the relay routes them), and whether
/// these credentials may route commands.
#[derive(Debug, Serialize)]
struct ControlCaps {
    accepts: [&'static str; 0],
    routes: bool,
}

/// `limits` on a socket: subscriptions, `from` positions, message bytes.
#[derive(Debug, Serialize)]
struct Limits {
    subscriptions: usize,
    from: usize,
    message_bytes: usize,
}

/// `{}`.
#[derive(Debug, Serialize)]
struct Empty {}
