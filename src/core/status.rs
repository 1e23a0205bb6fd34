//! What the core reports about itself: `GET /status` (the status page's JSON),
//! `GET /metrics` (Prometheus text), `GET /healthz`, and the capabilities both the
//! discovery document and the WebSocket `hello` declare (AEP-0003 §3.4, §4).

use super::conn::Phase;
use super::{ClusterState, Core, NOT_FOUND};
use crate::auth::{Grant, Scopes};
use crate::metrics::{self, Samples};
use crate::wire::envelope;
use bytes::Bytes;
use serde::Serialize;
use serde_json::json;

impl Core {
    /// `GET /status`: what the status page shows, as JSON: counts, totals (rates are
    /// the client's deltas), and the 100 most recently written sessions with their
    /// positions. A reader whose `grant` has a filter sees only the rows of the streams
    /// it admits (`Grant::admits_stream`); one with the `admin` scope also gets the ten
    /// most lagging consumers (`lagging`, rows of `GET /connections` that have something
    /// queued).
    pub(super) fn status_json(&self, grant: &Grant) -> Vec<u8> {
        let (http_n, sse_n, ws_n) = self.connection_counts();
        let pos = |p: Option<(u64, u64)>| p.map(|(e, s)| json!({"epoch": e, "seq": s}));
        let count = self.store.session_count();
        // The reader's own streams first, then the 100 most recent of them: another
        // tenant's activity does not push them out.
        let admitted: Vec<_> = match grant.filter() {
            None => self
                .store
                .sessions()
                .skip(count.saturating_sub(100))
                .collect(),
            Some(_) => self
                .store
                .sessions()
                .filter(|s| grant.admits_stream(s.name, s.agent))
                .collect(),
        };
        let recent: Vec<serde_json::Value> = admitted[admitted.len().saturating_sub(100)..]
            .iter()
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
        let mut doc = doc;
        if grant.scopes.contains(Scopes::ADMIN) {
            let rows = self.lagging(10, |r| r.queued_bytes > 0);
            doc["lagging"] = serde_json::to_value(rows).unwrap_or_default();
        }
        serde_json::to_vec(&doc).unwrap_or_default()
    }

    /// The Prometheus exposition of `GET /metrics` for a request of `grant`: the table
    /// of [`metrics::FAMILIES`], each with the samples [`Core::metric`] gives it. Peer
    /// addresses only for `admin`, as `GET /connections` (`watch` reads the metrics).
    pub(super) fn metrics_text(&self, grant: &Grant) -> String {
        let admin = grant.scopes.contains(Scopes::ADMIN);
        metrics::render(|f| self.metric(f.name, admin))
    }

    /// The samples of metric `name` (one of [`metrics::FAMILIES`]); `None` leaves it out
    /// of the exposition (no budget, not clustered). `admin`: per-connection series carry
    /// the peer's address.
    fn metric(&self, name: &str, admin: bool) -> Option<Samples<'_>> {
        let m = &self.metrics;
        let st = &self.hub.stats;
        let ev = self.store.evictions();
        Some(match name {
            metrics::INGESTED => Samples::by(
                "binding",
                [
                    ("http", m.ingested_http as f64),
                    ("ws", m.ingested_ws as f64),
                    ("jsonl", m.ingested_jsonl as f64),
                ],
            ),
            metrics::REJECTED => {
                Samples::by("reason", m.rejected.iter().map(|(c, n)| (*c, *n as f64)))
            }
            metrics::DELIVERIES => Samples::by(
                "binding",
                [
                    ("sse", (st.deliveries - st.deliveries_ws) as f64),
                    ("ws", st.deliveries_ws as f64),
                ],
            ),
            metrics::DROPPED => Samples::by(
                "severity",
                [
                    ("debug", st.dropped.debug as f64),
                    ("info", st.dropped.info as f64),
                ],
            ),
            metrics::DISCONNECTS => Samples::one(st.backpressure_disconnects as f64),
            metrics::REFUSED_CONNECTIONS => Samples::by(
                "reason",
                [
                    ("max-connections", m.refused_connections as f64),
                    ("per-ip", m.refused_per_ip as f64),
                    ("accept-rate", m.refused_accept_rate as f64),
                ],
            ),
            metrics::CONN_DROPPED => Samples::Values(
                self.conns
                    .iter()
                    .filter(|(_, c)| !c.subscriber.dropped.is_empty())
                    .map(|(key, c)| {
                        let mut labels = vec![("conn", key.to_string())];
                        if admin {
                            labels.push(("peer", c.peer.to_string()));
                        }
                        (labels, c.subscriber.dropped.total() as f64)
                    })
                    .collect(),
            ),
            metrics::CONNECTIONS => {
                let (http, sse, ws) = self.connection_counts();
                Samples::by(
                    "binding",
                    [
                        ("http", http as f64),
                        ("sse", sse as f64),
                        ("ws", ws as f64),
                    ],
                )
            }
            metrics::SUBSCRIPTIONS => Samples::one(self.hub.len() as f64),
            metrics::SESSIONS => Samples::one(self.store.session_count() as f64),
            metrics::BUFFERED_EVENTS => Samples::one(self.store.len() as f64),
            metrics::BUFFERED_BYTES => Samples::one(self.store.byte_len() as f64),
            metrics::QUEUED_BYTES => Samples::one(
                self.conns
                    .iter()
                    .map(|(_, c)| c.subscriber.out.len())
                    .sum::<usize>() as f64,
            ),
            metrics::MEMORY_BUDGET => Samples::one(self.ledger.budget? as f64),
            metrics::MEMORY_USED => Samples::by(
                "part",
                self.memory_used().parts().map(|(part, n)| (part, n as f64)),
            ),
            metrics::MEMORY_DROPPED => Samples::one(self.ledger.dropped_consumers as f64),
            metrics::EVICTIONS => Samples::by(
                "reason",
                [
                    ("ring", ev.ring as f64),
                    ("sessions", ev.sessions as f64),
                    ("memory", ev.memory as f64),
                ],
            ),
            metrics::UPTIME => Samples::one(self.uptime().as_secs_f64()),
            metrics::DELIVERY_LATENCY => {
                Samples::histograms("binding", [("sse", &m.latency_sse), ("ws", &m.latency_ws)])
            }
            metrics::POST_DURATION => Samples::Histograms(vec![(Vec::new(), &m.post_duration)]),
            _ => return self.cluster_metric(name),
        })
    }

    /// The samples of cluster metric `name`; `None` for a single relay.
    fn cluster_metric(&self, name: &str) -> Option<Samples<'_>> {
        let bus = self.bus.as_ref()?;
        Some(match name {
            metrics::CLUSTER_STATE => {
                let state = bus.state();
                Samples::by(
                    "state",
                    [
                        ClusterState::Connected,
                        ClusterState::CatchingUp,
                        ClusterState::Degraded,
                    ]
                    .map(|s| (s.as_str(), if s == state { 1.0 } else { 0.0 })),
                )
            }
            metrics::CLUSTER_LAG => Samples::one(bus.lag() as f64),
            metrics::CLUSTER_OUTBOX => Samples::one(bus.outbox_len() as f64),
            metrics::CLUSTER_RECONNECTS => Samples::one(bus.reconnects as f64),
            metrics::CLUSTER_CONSUMER_RESETS => Samples::one(bus.consumer_resets as f64),
            metrics::CLUSTER_PUBLISH_ERRORS => Samples::one(bus.publish_errors as f64),
            _ => return None,
        })
    }

    /// Open connections by binding: `(http, sse, ws)`.
    fn connection_counts(&self) -> (u64, u64, u64) {
        let (mut http, mut sse, mut ws) = (0, 0, 0);
        for (_, c) in self.conns.iter() {
            match c.phase {
                Phase::Sse { .. } => sse += 1,
                Phase::Ws(_) => ws += 1,
                _ => http += 1,
            }
        }
        (http, sse, ws)
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
    pub(super) fn hello_frame(&mut self, version: &'static str, grant: &Grant) -> Bytes {
        let routes = grant.authenticated && grant.scopes.contains(Scopes::CONTROL);
        // With tokens, each socket's `hello` tells its own grant: built for it.
        if self.config.auth.enabled() {
            return crate::wire::ws::aep::hello(version, &self.capabilities(Some(grant)));
        }
        if let Some((_, _, f)) = self
            .hellos
            .iter()
            .find(|(v, r, _)| *v == version && *r == routes)
        {
            return f.clone();
        }
        let f = crate::wire::ws::aep::hello(version, &self.capabilities(Some(grant)));
        self.hellos.push((version, routes, f.clone()));
        f
    }

    /// The relay's capabilities, the one source of both the discovery document
    /// (`grant` `None`, AEP-0003 §3.4) and the WebSocket `hello` (AEP-0003 §4) on a
    /// socket with `grant`: the same facts, except that a socket says whether *its*
    /// credentials may route commands, and declares its per-connection limits.
    pub(super) fn capabilities(&self, grant: Option<&Grant>) -> Capabilities {
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
            auth: c.auth.enabled().then(|| AuthCaps {
                schemes: c.auth.schemes(),
                grants: ["filter", "capture", "agent", "commands", "targets"],
                grant: grant.map(Grant::to_json),
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
    /// How credentials are checked and which grants are enforced (a relay-specific
    /// member: AEP-0003 §3.4 and §4 rule 4, unknown capability keys are ignored), when
    /// tokens are configured; on a socket's `hello`, also what its token grants.
    #[serde(skip_serializing_if = "Option::is_none")]
    auth: Option<AuthCaps>,
}

/// `auth`: the credentials taken (`bearer`: a token of `--token` or `--tokens-file`;
/// `jwt`: a JWT signed by a `--jwt-key` key) and the grants enforced on every path an
/// Event enters or leaves by (docs/operating.md, "Multi-tenant relay"); on a socket's
/// `hello`, `grant`: what the socket's token grants ([`Grant::to_json`]).
#[derive(Debug, Serialize)]
struct AuthCaps {
    schemes: Vec<&'static str>,
    grants: [&'static str; 5],
    #[serde(skip_serializing_if = "Option::is_none")]
    grant: Option<serde_json::Value>,
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
