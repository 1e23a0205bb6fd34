//! The route table: every `(method, path)` the relay serves, the scope it needs
//! (AEP-0003 §8.1) and what handles it. It alone decides 404, 405 with `Allow`, and the
//! methods a CORS preflight may ask for.

use crate::auth::Scopes;

/// What serves a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handler {
    /// `POST /events`: ingest (AEP-0003 §3.2).
    Ingest,
    /// The discovery document (AEP-0003 §3.4).
    Discovery,
    /// `GET /stream`: SSE (AEP-0003 §3.3).
    Stream,
    /// `GET /socket`: the WebSocket upgrade (AEP-0003 §3.5).
    Socket,
    /// `GET /status`: the status page's JSON.
    Status,
    /// `GET /connections`: one row per connection, most lagging first (scope `admin`).
    Connections,
    /// `GET /`: the status page.
    #[cfg(feature = "status-page")]
    StatusPage,
    /// `GET /metrics`: Prometheus text.
    Metrics,
    /// `GET /healthz`: answered whatever the credentials (counts when authenticated).
    Health,
    /// `GET /readyz`: 200 when the relay serves as a whole (always for a single relay;
    /// clustered, once connected and caught up), else 503; whatever the credentials.
    Ready,
}

/// One route.
#[derive(Debug)]
pub(crate) struct Route {
    pub(crate) method: &'static str,
    pub(crate) path: &'static str,
    /// The scope a token needs for it (`NONE`: any caller the auth check admits).
    pub(crate) scope: Scopes,
    pub(crate) handler: Handler,
}

const fn route(method: &'static str, path: &'static str, scope: Scopes, h: Handler) -> Route {
    Route {
        method,
        path,
        scope,
        handler: h,
    }
}

/// Every route, in the order `Allow` lists a path's methods.
pub(crate) const ROUTES: &[Route] = &[
    route("GET", "/events", Scopes::NONE, Handler::Discovery),
    route("POST", "/events", Scopes::EMIT, Handler::Ingest),
    route("GET", "/.well-known/aep", Scopes::NONE, Handler::Discovery),
    route("GET", "/stream", Scopes::WATCH, Handler::Stream),
    route("GET", "/socket", Scopes::NONE, Handler::Socket),
    route("GET", "/status", Scopes::WATCH, Handler::Status),
    route("GET", "/connections", Scopes::ADMIN, Handler::Connections),
    #[cfg(feature = "status-page")]
    route("GET", "/", Scopes::WATCH, Handler::StatusPage),
    route("GET", "/metrics", Scopes::WATCH, Handler::Metrics),
    route("GET", "/healthz", Scopes::NONE, Handler::Health),
    route("GET", "/readyz", Scopes::NONE, Handler::Ready),
];

/// What the table says of a request.
#[derive(Debug)]
pub(crate) enum Lookup {
    /// Served by this route.
    Found(&'static Route),
    /// The path exists, not with this method: 405 with `Allow` (these methods).
    MethodNotAllowed(String),
    /// No such path: 404.
    NotFound,
}

/// The methods served on `path`, as an `Allow` value (`GET, POST`); `None` for an
/// unknown path.
pub(crate) fn allow(path: &str) -> Option<String> {
    let methods: Vec<&str> = ROUTES
        .iter()
        .filter(|r| r.path == path)
        .map(|r| r.method)
        .collect();
    (!methods.is_empty()).then(|| methods.join(", "))
}

/// Looks `method path` up.
pub(crate) fn lookup(method: &str, path: &str) -> Lookup {
    if let Some(r) = ROUTES.iter().find(|r| r.path == path && r.method == method) {
        return Lookup::Found(r);
    }
    match allow(path) {
        Some(a) => Lookup::MethodNotAllowed(a),
        None => Lookup::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_answers_found_405_and_404() {
        assert!(matches!(
            lookup("POST", "/events"),
            Lookup::Found(Route {
                handler: Handler::Ingest,
                ..
            })
        ));
        match lookup("DELETE", "/events") {
            Lookup::MethodNotAllowed(a) => assert_eq!(a, "GET, POST"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(lookup("GET", "/nope"), Lookup::NotFound));
        assert_eq!(allow("/stream").as_deref(), Some("GET"));
    }
}
