//! Counters and the Prometheus text exposition of `GET /metrics` (auth: `watch`).
//! Metric names live here, in one place.

use std::fmt::Write as _;

/// Events ingested, by binding.
pub const INGESTED: &str = "aep_events_ingested_total";
/// Events (or batches) refused, by reason.
pub const REJECTED: &str = "aep_events_rejected_total";
/// Frames delivered to subscribers, by binding.
pub const DELIVERIES: &str = "aep_deliveries_total";
/// `debug`/`info` Events not delivered to a slow consumer (AEP-0003 §8.4).
pub const DROPPED: &str = "aep_backpressure_dropped_total";
/// Consumers disconnected because a `notice`+ Event could not be queued.
pub const DISCONNECTS: &str = "aep_backpressure_disconnects_total";
/// Drops per live connection that had any.
pub const CONN_DROPPED: &str = "aep_connection_dropped_events";
/// Open connections, by binding.
pub const CONNECTIONS: &str = "aep_connections";
/// Connections refused at the connection limit.
pub const REFUSED_CONNECTIONS: &str = "aep_connections_refused_total";
/// Live subscriptions.
pub const SUBSCRIPTIONS: &str = "aep_subscriptions";
/// Sessions held in the replay store.
pub const SESSIONS: &str = "aep_sessions";
/// Events held in the replay store.
pub const BUFFERED_EVENTS: &str = "aep_buffered_events";
/// Bytes of Events held in the replay store.
pub const BUFFERED_BYTES: &str = "aep_buffered_bytes";
/// Bytes queued for output across all connections.
pub const QUEUED_BYTES: &str = "aep_output_queued_bytes";
/// Seconds since start.
pub const UPTIME: &str = "aep_uptime_seconds";
/// Cluster mode: 1 for the relay's state (`connected`, `catching-up`, `degraded`).
pub const CLUSTER_STATE: &str = "aep_cluster_state";
/// Cluster mode: stream messages the relay's consumer has yet to deliver.
pub const CLUSTER_LAG: &str = "aep_cluster_lag_messages";
/// Cluster mode: Events ingested while degraded and not yet in the stream.
pub const CLUSTER_OUTBOX: &str = "aep_cluster_outbox_events";
/// Cluster mode: reconnections to the engine.
pub const CLUSTER_RECONNECTS: &str = "aep_cluster_reconnects_total";
/// Cluster mode: recreations of the relay's ordered consumer.
pub const CLUSTER_CONSUMER_RESETS: &str = "aep_cluster_consumer_resets_total";
/// Cluster mode: publishes the engine did not store.
pub const CLUSTER_PUBLISH_ERRORS: &str = "aep_cluster_publish_errors_total";

/// Counters the reactor keeps.
#[derive(Debug, Default, Clone)]
pub struct Metrics {
    /// Events ingested over HTTP POST.
    pub ingested_http: u64,
    /// Events ingested from WebSocket emitters (commands included).
    pub ingested_ws: u64,
    /// Refusals by error code (`invalid-event`, `too-many-events`, …).
    pub rejected: Vec<(&'static str, u64)>,
    /// Connections refused at the limit.
    pub refused_connections: u64,
}

impl Metrics {
    /// Counts one refusal with `code`.
    pub fn reject(&mut self, code: &'static str) {
        match self.rejected.iter_mut().find(|(c, _)| *c == code) {
            Some((_, n)) => *n += 1,
            None => self.rejected.push((code, 1)),
        }
    }
}

/// Builds Prometheus text format 0.0.4.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// Starts a metric family with its help text and type (`counter` or `gauge`).
    pub fn family(&mut self, name: &str, kind: &str, help: &str) -> &mut Self {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        self
    }

    /// One sample; `labels` are `(name, value)` pairs (values escaped here).
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) -> &mut Self {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let v = v
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                let _ = write!(self.out, "{k}=\"{v}\"");
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
        self
    }

    /// The text.
    pub fn finish(self) -> String {
        self.out
    }
}
