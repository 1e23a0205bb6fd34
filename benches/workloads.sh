# The workload forms benches/ab.sh and benches/instructions.sh share, sourced by both:
#   ws-N, sse-N        fan-out to N WebSocket / SSE subscribers: DELIVERIES / N Events
#                      (at least 100) of SIZE bytes, BATCH per write, WINDOW in flight
#   ingest-ws-S        1 WebSocket subscriber, the WebSocket emitter publishing
#   ingest-post-S      1 SSE subscriber, NDJSON POSTs publishing: INGEST_EVENTS Events
#                      of S bytes, INGEST_BATCH per write, INGEST_WINDOW in flight
# The caller sets those knobs and `die`.

# workload NAME: sets W_ARGS (aep-load's arguments), W_METRIC (the JSON field of the
# figure per server CPU-second), W_SUBS (subscribers) and W_DELIVERIES for NAME.
workload() {
    local w=$1 n s
    case "$w" in
        ws-[0-9]* | sse-[0-9]*)
            n=${w#*-}
            [[ $n =~ ^[1-9][0-9]*$ ]] || die "workload $w: N must be a positive number"
            local events=$((DELIVERIES / n))
            if ((events < 100)); then events=100; fi
            W_ARGS="--target ${w%%-*} --subscribers $n --events $events --size $SIZE --batch $BATCH --window $WINDOW"
            W_METRIC=deliveries_per_server_cpu_s
            W_SUBS=$n
            W_DELIVERIES=$((n * events))
            ;;
        ingest-ws-[0-9]* | ingest-post-[0-9]*)
            s=${w##*-}
            [[ $s =~ ^[1-9][0-9]*$ ]] || die "workload $w: S must be a positive number"
            local target=ws
            if [[ $w == ingest-post-* ]]; then target=sse; fi
            W_ARGS="--target $target --subscribers 1 --events $INGEST_EVENTS --size $s --batch $INGEST_BATCH --window $INGEST_WINDOW"
            W_METRIC=events_per_server_cpu_s
            W_SUBS=1
            W_DELIVERIES=$INGEST_EVENTS
            ;;
        *) die "unknown workload '$w' (the forms: ws-N, sse-N, ingest-ws-S, ingest-post-S)" ;;
    esac
}
