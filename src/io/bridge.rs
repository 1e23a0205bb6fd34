//! The bridge thread (feature `cluster`): async-nats on one thread, `aep-cluster`, with a
//! current-thread tokio runtime, talking to the reactor over two bounded channels and the
//! reactor's `mio::Waker` (as the JSONL sources do, [`crate::wire::jsonl`]). The reactor stays
//! single-threaded and free of any async runtime; it owns a [`Bridge`], hands it
//! [`ToBus`] values with [`Bridge::send`] and takes [`FromBus`] values with
//! [`Bridge::try_recv`] when woken.
//!
//! # What the thread does
//!
//! - **Connects** to [`ClusterConfig::urls`] and keeps retrying forever, first connection
//!   included; the client reconnects by itself. Each time it is connected it makes sure
//!   the stream and the claims bucket exist, reads the stream's last sequence, and only
//!   then reports [`FromBus::Connected`]; a loss is [`FromBus::Disconnected`].
//! - **Publishes** in the order it is asked to, pipelined: the publish is sent at once and
//!   its ack awaited in a task of its own, at most [`MAX_IN_FLIGHT`] at a time (beyond
//!   that it stops taking [`ToBus`] values, so [`Bridge::send`] gives them back).
//! - **Consumes** the whole stream with one ordered consumer of its own (an ephemeral pull
//!   consumer without acks, in memory): it checks that consumer sequences follow each
//!   other and recreates the consumer after the last stream sequence it delivered on a
//!   gap, a deletion ("Consumer Deleted"), missed idle heartbeats, any pull error and on
//!   every reconnect, reporting [`FromBus::ConsumerReset`]. async-nats has an ordered
//!   consumer too, but it recreates itself silently; the relay counts resets.
//! - **Watches** the claims bucket (`{stream}_claims`, history 1, `max_age` =
//!   [`ClusterConfig::claim_ttl`]) with its current values, again after each reconnect,
//!   and reports an entry not put again within `claim_ttl` of the bridge last seeing it
//!   as gone: nats-server 2.9 expires KV entries without telling a watcher. Claim puts and
//!   deletes are applied one at a time in order by a task of their own, and while one is
//!   under way the later operations on one key collapse into the latest.
//! - **Answers** requests on [`relay_subject`] and sends requests to other relays.
//! - **Probes** the engine while connected: a JetStream API request (`$JS.API.INFO`)
//!   every [`PROBE_EVERY`], one at a time, each given [`PROBE_TIMEOUT`]. [`PROBE_MISSES`]
//!   misses in a row report [`FromBus::Stalled`], the next answer [`FromBus::Answering`].
//!   So a relay with no ingest of its own notices an engine that keeps its connections
//!   open and answers nothing (a SIGSTOPped nats-server), which neither the client nor
//!   the publishes would tell it.

use crate::cluster::{
    relay_subject, ClusterAuth, ClusterConfig, FromBus, ToBus, NOT_CONNECTED, NO_RESPONDERS,
    PROBE_EVERY, PROBE_MISSES, PROBE_TIMEOUT, TIMEOUT,
};
use async_nats::jetstream::{self, consumer::pull, kv};
use bytes::Bytes;
use futures_util::StreamExt;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::task::JoinSet;

/// [`ToBus`] values the channel to the bridge holds before [`Bridge::send`] gives them back.
pub const TO_BUS_CAPACITY: usize = 1024;
/// [`FromBus`] values the channel to the reactor holds before the bridge waits for it (and
/// stops pulling from the stream meanwhile).
pub const FROM_BUS_CAPACITY: usize = 4096;
/// Publishes whose ack is awaited at once.
pub const MAX_IN_FLIGHT: usize = 256;
/// The ordered consumer's idle heartbeat: two missed ones recreate it.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long one pull request of the ordered consumer stays open.
const PULL_EXPIRES: Duration = Duration::from_secs(10);
/// Messages one pull request of the ordered consumer asks for.
const PULL_BATCH: usize = 512;
/// How often the thread looks at its timers (claim expiry, retries, stale replies).
const TICK: Duration = Duration::from_millis(200);
/// The pause before a failed set-up step is tried again.
const RETRY: Duration = Duration::from_millis(500);

/// Why [`Bridge::start`] failed. Nothing here is a connection failure: the bridge connects
/// in the background and keeps retrying.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// A setting cannot work (no URL, a malformed URL, an empty relay id, an unreadable
    /// credentials file); the text says which.
    #[error("cluster configuration: {0}")]
    Config(String),
    /// The runtime or the thread could not be made.
    #[error("cluster bridge thread: {0}")]
    Io(#[from] std::io::Error),
}

/// The reactor's end of the bridge. Dropping it (or [`Bridge::shutdown`]) stops the
/// thread and joins it.
pub struct Bridge {
    tx: Option<mpsc::Sender<ToBus>>,
    rx: Option<mpsc::Receiver<FromBus>>,
    woken: Arc<AtomicBool>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Bridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bridge").finish_non_exhaustive()
    }
}

impl Bridge {
    /// Starts the thread `aep-cluster`. It connects in the background (retrying forever)
    /// and wakes `waker` whenever it queues [`FromBus`] values: once until
    /// [`Bridge::try_recv`] has found the queue empty, however many it queues meanwhile.
    ///
    /// # Errors
    /// [`BridgeError::Config`] for a setting that cannot work, [`BridgeError::Io`] when the
    /// runtime or the thread cannot be made.
    pub fn start(config: ClusterConfig, waker: Arc<mio::Waker>) -> Result<Bridge, BridgeError> {
        let options = connect_options(&config)?;
        let mut addrs = Vec::with_capacity(config.urls.len());
        for url in &config.urls {
            addrs.push(
                url.parse::<async_nats::ServerAddr>()
                    .map_err(|e| BridgeError::Config(format!("{url:?}: {e}")))?,
            );
        }
        if addrs.is_empty() {
            return Err(BridgeError::Config("no server URL".into()));
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (tx, inbox) = mpsc::channel(TO_BUS_CAPACITY);
        let (out_tx, rx) = mpsc::channel(FROM_BUS_CAPACITY);
        let (stop, stopped) = oneshot::channel();
        let woken = Arc::new(AtomicBool::new(false));
        let out = Out {
            tx: out_tx,
            waker,
            woken: woken.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("aep-cluster".into())
            .spawn(move || {
                rt.block_on(run(config, options, addrs, out, inbox, stopped));
                log::debug!("cluster: bridge thread ends");
            })?;
        Ok(Bridge {
            tx: Some(tx),
            rx: Some(rx),
            woken,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Queues `msg` for the bus without blocking; gives it back when the queue is full
    /// ([`TO_BUS_CAPACITY`], or the bridge has [`MAX_IN_FLIGHT`] publishes unanswered and
    /// the queue has filled behind them) or the thread has ended.
    pub fn send(&self, msg: ToBus) -> Result<(), ToBus> {
        match &self.tx {
            Some(tx) => tx.try_send(msg).map_err(|e| e.into_inner()),
            None => Err(msg),
        }
    }

    /// The next value from the bus, without blocking; `None` when there is none now. Call
    /// it until `None` after each wake-up: the waker is woken again only after that.
    pub fn try_recv(&mut self) -> Option<FromBus> {
        let rx = self.rx.as_mut()?;
        if let Ok(v) = rx.try_recv() {
            return Some(v);
        }
        // Empty: re-arm the wake, then look once more, for a value queued between the
        // look and the re-arm (its sender saw the flag still set and did not wake).
        self.woken.store(false, Ordering::SeqCst);
        rx.try_recv().ok()
    }

    /// Stops the thread (dropping what is queued either way) and waits for it to end.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        // Receiver first: a thread waiting to hand over a value sees it gone and stops.
        self.rx.take();
        self.tx.take();
        self.stop.take();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                log::error!("cluster: the bridge thread panicked");
            }
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// The reactor is gone: the thread stops.
struct Gone;

/// The thread's end of the channel to the reactor.
#[derive(Clone)]
struct Out {
    tx: mpsc::Sender<FromBus>,
    waker: Arc<mio::Waker>,
    woken: Arc<AtomicBool>,
}

impl Out {
    async fn send(&self, v: FromBus) -> Result<(), Gone> {
        self.tx.send(v).await.map_err(|_| Gone)?;
        if !self.woken.swap(true, Ordering::SeqCst) {
            if let Err(e) = self.waker.wake() {
                log::warn!("cluster: waking the reactor failed: {e}");
            }
        }
        Ok(())
    }
}

/// The client's options: credentials, TLS, timeouts, retry forever, a short reconnect
/// back-off.
fn connect_options(c: &ClusterConfig) -> Result<async_nats::ConnectOptions, BridgeError> {
    if c.relay_id.is_empty() {
        return Err(BridgeError::Config("the relay id is empty".into()));
    }
    let mut o = match &c.auth {
        ClusterAuth::None => async_nats::ConnectOptions::new(),
        ClusterAuth::Token(t) => async_nats::ConnectOptions::with_token(t.clone()),
        ClusterAuth::UserPassword { user, password } => {
            async_nats::ConnectOptions::with_user_and_password(user.clone(), password.clone())
        }
        ClusterAuth::Credentials(path) => {
            let creds = std::fs::read_to_string(path)
                .map_err(|e| BridgeError::Config(format!("{}: {e}", path.display())))?;
            async_nats::ConnectOptions::with_credentials(&creds)
                .map_err(|e| BridgeError::Config(format!("{}: {e}", path.display())))?
        }
    };
    if let Some(ca) = &c.tls_ca {
        std::fs::metadata(ca).map_err(|e| BridgeError::Config(format!("{}: {e}", ca.display())))?;
        o = o.add_root_certificates(ca.clone()).require_tls(true);
    }
    Ok(o.name(format!("aep-relay {}", c.relay_id))
        .retry_on_initial_connect()
        .max_reconnects(None)
        .request_timeout(Some(c.request_timeout))
        .reconnect_delay_callback(|attempts| {
            // 0, 50, 100, 200 … ms, at most 2 s: a restarted engine is found quickly.
            let n = attempts.saturating_sub(1).min(6) as u32;
            if attempts <= 1 {
                Duration::ZERO
            } else {
                Duration::from_millis(50 * 2u64.pow(n)).min(Duration::from_secs(2))
            }
        }))
}

/// The stream holding every Event, with only fields nats-server 2.9 knows.
fn stream_config(c: &ClusterConfig) -> jetstream::stream::Config {
    jetstream::stream::Config {
        name: c.stream.clone(),
        description: Some("AEP Events (aep-relay cluster mode)".into()),
        subjects: vec![format!("{}.ev.>", c.prefix), format!("{}.ag.>", c.prefix)],
        storage: jetstream::stream::StorageType::File,
        retention: jetstream::stream::RetentionPolicy::Limits,
        discard: jetstream::stream::DiscardPolicy::Old,
        max_messages_per_subject: c.max_msgs_per_subject,
        max_messages: -1,
        max_bytes: -1,
        max_consumers: -1,
        max_age: c.max_age,
        duplicate_window: c.duplicate_window,
        num_replicas: 1,
        ..Default::default()
    }
}

/// The claims bucket, created when missing.
///
/// The bucket's stream is created here rather than with async-nats's `create_key_value`:
/// that reads the account info first and fails to parse nats-server 2.9's (it lacks
/// `reserved_memory` and `reserved_storage`). The stream is what `create_key_value` would
/// make (ADR-8: `KV_{bucket}`, subjects `$KV.{bucket}.>`, one message per key, roll-ups,
/// direct get, discard new), with only fields 2.9 knows.
async fn claims_store(js: &jetstream::Context, c: &ClusterConfig) -> Result<kv::Store, String> {
    let bucket = c.claims_bucket();
    if let Ok(store) = js.get_key_value(&bucket).await {
        return Ok(store);
    }
    js.get_or_create_stream(jetstream::stream::Config {
        name: format!("KV_{bucket}"),
        description: Some("AEP session claims (aep-relay cluster mode)".into()),
        subjects: vec![format!("$KV.{bucket}.>")],
        max_messages_per_subject: 1,
        max_messages: -1,
        max_bytes: -1,
        max_consumers: -1,
        max_age: c.claim_ttl,
        duplicate_window: c.claim_ttl.min(Duration::from_secs(120)),
        storage: jetstream::stream::StorageType::File,
        num_replicas: 1,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        discard: jetstream::stream::DiscardPolicy::New,
        ..Default::default()
    })
    .await
    .map_err(|e| format!("claims bucket {bucket}: {e}"))?;
    js.get_key_value(&bucket)
        .await
        .map_err(|e| format!("claims bucket {bucket}: {e}"))
}

/// The next item of an optional stream; never, while there is none.
async fn next_of<S: futures_util::Stream + Unpin>(s: &mut Option<S>) -> Option<S::Item> {
    match s {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}

/// A timer that may be off.
async fn at(when: Option<Instant>) {
    match when {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

async fn run(
    config: ClusterConfig,
    options: async_nats::ConnectOptions,
    addrs: Vec<async_nats::ServerAddr>,
    out: Out,
    mut inbox: mpsc::Receiver<ToBus>,
    mut stopped: oneshot::Receiver<()>,
) {
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let options = options.event_callback(move |ev| {
        let tx = events_tx.clone();
        async move {
            let _ = tx.send(ev);
        }
    });
    let client = match options.connect(addrs).await {
        Ok(c) => c,
        Err(e) => {
            // With retry on initial connect this is a setting the client refuses.
            log::error!("cluster: cannot start the NATS client: {e}");
            let reason = format!("cannot start the NATS client: {e}");
            let _ = out.send(FromBus::Disconnected { reason }).await;
            return;
        }
    };
    let js = jetstream::ContextBuilder::new()
        .timeout(config.ack_timeout)
        .build(client.clone());
    let claims = ClaimWriter::start(js.clone(), config.clone());
    let own_prefix = crate::cluster::publish_id_prefix(&config.relay_id);
    let mut link = Link {
        config,
        client,
        js,
        out,
        claims,
        nats_up: false,
        ready: false,
        last_error: None,
        retry_at: None,
        consumer: None,
        consumer_name: None,
        consumer_seq: 0,
        consumer_made: false,
        last_seq: 0,
        own_prefix,
        watch: None,
        seen_claims: HashMap::new(),
        requests: None,
        replies: HashMap::new(),
        next_reply: 0,
        acks: JoinSet::new(),
        responses: JoinSet::new(),
    };
    let ready = Arc::new(AtomicBool::new(false));
    tokio::spawn(probe(link.client.clone(), link.out.clone(), ready.clone()));
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let r: Result<(), Gone> = async {
        loop {
            // The prober probes only a connection that is set up.
            ready.store(link.ready, Ordering::SeqCst);
            // Unbiased: a long catch-up of the stream must not starve requests, acks or
            // the timers.
            tokio::select! {
                _ = &mut stopped => return Ok(()),
                Some(ev) = events.recv() => link.on_event(ev).await?,
                Some(done) = link.acks.join_next(), if !link.acks.is_empty() => {
                    if let Ok(v) = done { link.out.send(v).await? }
                }
                Some(done) = link.responses.join_next(), if !link.responses.is_empty() => {
                    if let Ok(v) = done { link.out.send(v).await? }
                }
                cmd = inbox.recv(), if link.acks.len() < MAX_IN_FLIGHT => match cmd {
                    Some(cmd) => link.on_command(cmd).await?,
                    None => return Ok(()),
                },
                m = next_of(&mut link.consumer), if link.ready => link.on_message(m).await?,
                e = next_of(&mut link.watch), if link.ready => link.on_claim(e).await?,
                r = next_of(&mut link.requests) => link.on_request(r).await?,
                _ = at(link.retry_at) => link.retry().await?,
                _ = tick.tick() => link.on_tick().await?,
            }
        }
    }
    .await;
    if r.is_err() {
        log::debug!("cluster: the reactor's end is gone");
    }
}

/// The prober: a task of its own, so that no await of the main loop (a consumer being
/// recreated against a frozen engine waits for its API timeout) delays it. While the
/// connection is set up (`ready`) it sends a JetStream API request (`$JS.API.INFO`) every
/// [`PROBE_EVERY`], each given [`PROBE_TIMEOUT`]; [`PROBE_MISSES`] misses in a row report
/// [`FromBus::Stalled`], the next answer [`FromBus::Answering`]. While not set up it
/// forgets both (the main loop reports [`FromBus::Disconnected`] and the core leaves a
/// stall with it).
async fn probe(client: async_nats::Client, out: Out, ready: Arc<AtomicBool>) {
    let mut misses = 0u32;
    let mut stalled = false;
    loop {
        let started = Instant::now();
        if !ready.load(Ordering::SeqCst) {
            misses = 0;
            stalled = false;
            tokio::time::sleep(PROBE_EVERY).await;
            continue;
        }
        let request = client.request("$JS.API.INFO", Bytes::new());
        let r = match tokio::time::timeout(PROBE_TIMEOUT, request).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {PROBE_TIMEOUT:?}")),
        };
        if !ready.load(Ordering::SeqCst) {
            continue;
        }
        let sent = match r {
            Ok(()) => {
                misses = 0;
                if std::mem::take(&mut stalled) {
                    log::info!("cluster: the engine answers again");
                    out.send(FromBus::Answering).await
                } else {
                    Ok(())
                }
            }
            Err(e) => {
                misses += 1;
                log::debug!("cluster: probe missed ({e}), {misses} in a row");
                if misses >= PROBE_MISSES && !stalled {
                    stalled = true;
                    let reason = format!("{misses} probes in a row unanswered ({e})");
                    log::warn!("cluster: the engine does not answer: {reason}");
                    out.send(FromBus::Stalled { reason }).await
                } else {
                    Ok(())
                }
            }
        };
        if sent.is_err() {
            return; // the reactor is gone
        }
        tokio::time::sleep_until((started + PROBE_EVERY).into()).await;
    }
}

/// The bridge thread's state: its link to the engine (the NATS client, the stream's
/// consumer, the claims watch, the requests awaiting replies). Not the core's `Bus`,
/// which is cluster mode's logic inside the core (`core::cluster`).
struct Link {
    config: ClusterConfig,
    client: async_nats::Client,
    js: jetstream::Context,
    out: Out,
    claims: ClaimWriter,
    /// The NATS connection is up (the client said Connected, not Disconnected since).
    nats_up: bool,
    /// Set up on this connection and [`FromBus::Connected`] sent: messages may flow.
    ready: bool,
    /// The client's last error report, for [`FromBus::Disconnected`].
    last_error: Option<String>,
    /// When to retry what failed (the set-up, the consumer, the watch).
    retry_at: Option<Instant>,
    consumer: Option<pull::Stream>,
    consumer_name: Option<String>,
    /// The consumer sequence of the last message from the current consumer.
    consumer_seq: u64,
    /// A consumer has been made before: making another is a reset.
    consumer_made: bool,
    /// The last stream sequence delivered to the reactor.
    last_seq: u64,
    /// This relay's [`crate::cluster::publish_id_prefix`].
    own_prefix: String,
    watch: Option<kv::Watch>,
    /// Claims reported present, and when each expires unless put again.
    seen_claims: HashMap<String, Instant>,
    requests: Option<async_nats::Subscriber>,
    /// Requests awaiting a [`ToBus::Reply`]: reply subject, and when it came.
    replies: HashMap<u64, (async_nats::Subject, Instant)>,
    next_reply: u64,
    acks: JoinSet<FromBus>,
    responses: JoinSet<FromBus>,
}

impl Link {
    async fn on_event(&mut self, ev: async_nats::Event) -> Result<(), Gone> {
        match ev {
            async_nats::Event::Connected => {
                log::info!("cluster: connected to {}", self.client.server_info().host);
                self.nats_up = true;
                self.last_error = None;
                self.set_up().await?;
            }
            async_nats::Event::Disconnected => {
                self.nats_up = false;
                self.consumer = None;
                self.watch = None;
                self.retry_at = None;
                if std::mem::take(&mut self.ready) {
                    let reason = self
                        .last_error
                        .take()
                        .unwrap_or_else(|| "disconnected".into());
                    log::warn!("cluster: connection lost ({reason})");
                    self.out.send(FromBus::Disconnected { reason }).await?;
                }
            }
            async_nats::Event::ServerError(e) => {
                log::warn!("cluster: server error: {e}");
                self.last_error = Some(format!("server error: {e}"));
            }
            async_nats::Event::ClientError(e) => {
                log::warn!("cluster: client error: {e}");
                self.last_error = Some(format!("client error: {e}"));
            }
            other => log::info!("cluster: {other}"),
        }
        Ok(())
    }

    /// On a connection: the stream, the bucket, the last sequence, the request
    /// subscription, then Connected, then the watch and the consumer. A failed step is
    /// retried after [`RETRY`].
    async fn set_up(&mut self) -> Result<(), Gone> {
        if !self.nats_up || self.ready {
            return Ok(());
        }
        match self.connect_steps().await {
            Ok(last_seq) => {
                let max_payload = self.client.server_info().max_payload;
                log::info!(
                    "cluster: stream {} ready (last sequence {last_seq}, max_payload {max_payload})",
                    self.config.stream
                );
                self.ready = true;
                self.out
                    .send(FromBus::Connected {
                        max_payload,
                        last_seq,
                    })
                    .await?;
                self.watch().await;
                self.make_consumer().await?;
            }
            Err(e) => {
                log::warn!("cluster: set-up failed, retrying: {e}");
                self.retry_at = Some(Instant::now() + RETRY);
            }
        }
        Ok(())
    }

    async fn connect_steps(&mut self) -> Result<u64, String> {
        let stream = self
            .js
            .get_or_create_stream(stream_config(&self.config))
            .await
            .map_err(|e| format!("stream {}: {e}", self.config.stream))?;
        claims_store(&self.js, &self.config).await?;
        let info = stream
            .get_info()
            .await
            .map_err(|e| format!("stream {} info: {e}", self.config.stream))?;
        if self.requests.is_none() {
            let subject = relay_subject(&self.config.prefix, &self.config.relay_id);
            self.requests = Some(
                self.client
                    .subscribe(subject.clone())
                    .await
                    .map_err(|e| format!("subscribe {subject}: {e}"))?,
            );
        }
        Ok(info.state.last_sequence)
    }

    /// (Re)starts the claims watch with the bucket's current values.
    async fn watch(&mut self) {
        self.watch = None;
        let r = async {
            let store = claims_store(&self.js, &self.config).await?;
            store
                .watch_with_history(">")
                .await
                .map_err(|e| format!("watch: {e}"))
        }
        .await;
        match r {
            Ok(w) => self.watch = Some(w),
            Err(e) => {
                log::warn!("cluster: claims watch failed, retrying: {e}");
                self.retry_at = Some(Instant::now() + RETRY);
            }
        }
    }

    /// (Re)creates the ordered consumer after the last delivered stream sequence.
    async fn make_consumer(&mut self) -> Result<(), Gone> {
        self.consumer = None;
        if let Some(old) = self.consumer_name.take() {
            // An ephemeral consumer goes by itself once idle; deleting it is a courtesy.
            let js = self.js.clone();
            let stream = self.config.stream.clone();
            tokio::spawn(async move {
                let _ = js.delete_consumer_from_stream(&old, &stream).await;
            });
        }
        let deliver_policy = if self.last_seq == 0 {
            jetstream::consumer::DeliverPolicy::All
        } else {
            jetstream::consumer::DeliverPolicy::ByStartSequence {
                start_sequence: self.last_seq + 1,
            }
        };
        let config = pull::Config {
            description: Some(format!("aep-relay {}", self.config.relay_id)),
            deliver_policy,
            ack_policy: jetstream::consumer::AckPolicy::None,
            max_deliver: 1,
            memory_storage: true,
            num_replicas: 1,
            inactive_threshold: Duration::from_secs(30),
            ..Default::default()
        };
        let r = async {
            let consumer = self
                .js
                .create_consumer_on_stream(config, self.config.stream.as_str())
                .await
                .map_err(|e| format!("create consumer: {e}"))?;
            let name = consumer.cached_info().name.clone();
            let stream = consumer
                .stream()
                .max_messages_per_batch(PULL_BATCH)
                .expires(PULL_EXPIRES)
                .heartbeat(HEARTBEAT)
                .messages()
                .await
                .map_err(|e| format!("consumer {name}: {e}"))?;
            Ok::<_, String>((name, stream))
        }
        .await;
        match r {
            Ok((name, stream)) => {
                log::debug!("cluster: consumer {name} from {deliver_policy:?}");
                self.consumer_name = Some(name);
                self.consumer = Some(stream);
                self.consumer_seq = 0;
                if std::mem::replace(&mut self.consumer_made, true) {
                    self.out.send(FromBus::ConsumerReset).await?;
                }
            }
            Err(e) => {
                log::warn!("cluster: {e}; retrying");
                self.retry_at = Some(Instant::now() + RETRY);
            }
        }
        Ok(())
    }

    /// Retries whatever failed: the set-up, else the watch, else the consumer.
    async fn retry(&mut self) -> Result<(), Gone> {
        self.retry_at = None;
        if !self.nats_up {
            return Ok(());
        }
        if !self.ready {
            return self.set_up().await;
        }
        if self.watch.is_none() {
            self.watch().await;
        }
        if self.consumer.is_none() {
            self.make_consumer().await?;
        }
        Ok(())
    }

    async fn on_message(
        &mut self,
        m: Option<Result<jetstream::Message, pull::MessagesError>>,
    ) -> Result<(), Gone> {
        let m = match m {
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                log::warn!("cluster: consumer: {e}; recreating it");
                return self.make_consumer().await;
            }
            None => {
                log::warn!("cluster: consumer ended; recreating it");
                return self.make_consumer().await;
            }
        };
        let (cseq, sseq, pending) = match m.info() {
            Ok(i) => (i.consumer_sequence, i.stream_sequence, i.pending),
            Err(e) => {
                log::warn!(
                    "cluster: a message without JetStream metadata ({e}); recreating the consumer"
                );
                return self.make_consumer().await;
            }
        };
        if cseq != self.consumer_seq + 1 {
            log::warn!(
                "cluster: consumer gap (sequence {cseq} after {}); recreating it",
                self.consumer_seq
            );
            return self.make_consumer().await;
        }
        self.consumer_seq = cseq;
        if sseq <= self.last_seq {
            log::debug!("cluster: stream sequence {sseq} again; dropped");
            return Ok(());
        }
        self.last_seq = sseq;
        let own_id = m
            .message
            .headers
            .as_ref()
            .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
            .map(|v| v.as_str())
            .filter(|v| v.starts_with(&self.own_prefix))
            .map(str::to_owned);
        self.out
            .send(FromBus::Message {
                stream_seq: sseq,
                pending,
                payload: m.message.payload,
                own_id,
            })
            .await
    }

    async fn on_claim(
        &mut self,
        e: Option<Result<kv::Entry, kv::WatcherError>>,
    ) -> Result<(), Gone> {
        let e = match e {
            Some(Ok(e)) => e,
            Some(Err(err)) => {
                log::warn!("cluster: claims watch: {err}; watching again");
                self.watch = None;
                self.retry_at = Some(Instant::now());
                return Ok(());
            }
            None => {
                self.watch = None;
                self.retry_at = Some(Instant::now());
                return Ok(());
            }
        };
        let value = match e.operation {
            kv::Operation::Put => {
                self.seen_claims
                    .insert(e.key.clone(), Instant::now() + self.config.claim_ttl);
                Some(e.value)
            }
            kv::Operation::Delete | kv::Operation::Purge => {
                self.seen_claims.remove(&e.key);
                None
            }
        };
        self.out.send(FromBus::Claim { key: e.key, value }).await
    }

    async fn on_request(&mut self, r: Option<async_nats::Message>) -> Result<(), Gone> {
        let Some(m) = r else {
            log::warn!("cluster: the request subscription ended; subscribing again");
            self.requests = None;
            self.ready = false;
            self.retry_at = Some(Instant::now());
            return Ok(());
        };
        let Some(reply) = m.reply else {
            log::debug!("cluster: a request without a reply subject; dropped");
            return Ok(());
        };
        self.next_reply += 1;
        let id = self.next_reply;
        self.replies.insert(id, (reply, Instant::now()));
        self.out
            .send(FromBus::Request {
                reply: id,
                payload: m.payload,
            })
            .await
    }

    async fn on_command(&mut self, cmd: ToBus) -> Result<(), Gone> {
        match cmd {
            ToBus::Publish {
                ticket,
                subject,
                msg_id,
                payload,
            } => {
                if !self.ready {
                    // The core's outbox is the one buffer of an outage: no second, hidden
                    // one here. (A publish sent just before a loss is noticed is buffered
                    // by the client and answered when its ack comes or times out.)
                    let error = NOT_CONNECTED.to_string();
                    return self
                        .out
                        .send(FromBus::PublishFailed { ticket, error })
                        .await;
                }
                let msg = jetstream::message::PublishMessage::build()
                    .payload(payload)
                    .message_id(msg_id);
                match self.js.send_publish(subject, msg).await {
                    Ok(ack) => {
                        self.acks.spawn(async move {
                            match ack.await {
                                Ok(a) => FromBus::Acked {
                                    ticket,
                                    stream_seq: a.sequence,
                                    duplicate: a.duplicate,
                                },
                                Err(e) => FromBus::PublishFailed {
                                    ticket,
                                    error: e.to_string(),
                                },
                            }
                        });
                    }
                    Err(e) => {
                        self.out
                            .send(FromBus::PublishFailed {
                                ticket,
                                error: e.to_string(),
                            })
                            .await?
                    }
                }
            }
            ToBus::PutClaim { key, value } => self.claims.push(key, Some(value)),
            ToBus::DeleteClaim { key } => self.claims.push(key, None),
            ToBus::Request {
                ticket,
                relay,
                payload,
            } => {
                if !self.ready {
                    let result = Err(NOT_CONNECTED.to_string());
                    return self.out.send(FromBus::Response { ticket, result }).await;
                }
                let client = self.client.clone();
                let subject = relay_subject(&self.config.prefix, &relay);
                self.responses.spawn(async move {
                    let result = client.request(subject, payload).await.map(|m| m.payload);
                    let result = result.map_err(|e| match e.kind() {
                        async_nats::RequestErrorKind::NoResponders => NO_RESPONDERS.to_string(),
                        async_nats::RequestErrorKind::TimedOut => TIMEOUT.to_string(),
                        _ => e.to_string(),
                    });
                    FromBus::Response { ticket, result }
                });
            }
            ToBus::Reply { reply, payload } => match self.replies.remove(&reply) {
                Some((subject, _)) => {
                    if let Err(e) = self.client.publish(subject, payload).await {
                        log::warn!("cluster: reply {reply}: {e}");
                    }
                }
                None => log::debug!("cluster: reply {reply} is unknown or expired; dropped"),
            },
        }
        Ok(())
    }

    /// Claims not put again within their TTL are gone; stale reply handles are dropped.
    async fn on_tick(&mut self) -> Result<(), Gone> {
        let now = Instant::now();
        let expired: Vec<String> = self
            .seen_claims
            .iter()
            .filter(|(_, &t)| t <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for key in expired {
            self.seen_claims.remove(&key);
            log::debug!("cluster: claim {key} expired");
            self.out.send(FromBus::Claim { key, value: None }).await?;
        }
        let keep = self.config.request_timeout * 2 + Duration::from_secs(1);
        self.replies
            .retain(|_, (_, at)| now.duration_since(*at) < keep);
        Ok(())
    }
}

/// The claims writer (not `control::Claims`, the core's live claims): puts and deletes
/// applied in order, one at a time, by a task of its own (so a slow or absent engine
/// never holds up the publishes); operations on a key waiting behind another collapse
/// into the latest.
struct ClaimWriter {
    queue: Arc<Mutex<ClaimQueue>>,
    notify: Arc<Notify>,
}

#[derive(Default)]
struct ClaimQueue {
    order: VecDeque<String>,
    latest: HashMap<String, Option<Bytes>>,
}

impl ClaimWriter {
    fn start(js: jetstream::Context, config: ClusterConfig) -> ClaimWriter {
        let queue = Arc::new(Mutex::new(ClaimQueue::default()));
        let notify = Arc::new(Notify::new());
        let (q, n) = (queue.clone(), notify.clone());
        tokio::spawn(async move {
            let mut store = None;
            loop {
                let next = {
                    let mut q = q.lock().unwrap();
                    q.order.pop_front().map(|k| {
                        let v = q.latest.remove(&k).flatten();
                        (k, v)
                    })
                };
                let Some((key, value)) = next else {
                    n.notified().await;
                    continue;
                };
                let s = loop {
                    if let Some(s) = &store {
                        break s;
                    }
                    match claims_store(&js, &config).await {
                        Ok(s) => store = Some(s),
                        Err(e) => {
                            log::warn!("cluster: {e}; retrying");
                            tokio::time::sleep(RETRY).await;
                        }
                    }
                };
                let r = match value {
                    Some(v) => s.put(&key, v).await.map(|_| ()).map_err(|e| e.to_string()),
                    None => s.delete(&key).await.map_err(|e| e.to_string()),
                };
                if let Err(e) = r {
                    log::warn!("cluster: claim {key}: {e}");
                }
            }
        });
        ClaimWriter { queue, notify }
    }

    fn push(&self, key: String, value: Option<Bytes>) {
        let mut q = self.queue.lock().unwrap();
        if q.latest.insert(key.clone(), value).is_none() {
            q.order.push_back(key);
        }
        drop(q);
        self.notify.notify_one();
    }
}
