"""Prometheus source: dcgm-exporter series, aggregated by Prometheus, fetched incrementally.

One read path: `plan` (what a tick asks, grouped where it can; `rules`: the pool
recording rules), `fetch` (the queries on one kept thread pool), `transport` (HTTP,
auth, TLS, retries, secrets scrubbed), `window` (the one decoder, and per target a
window of buckets), `source` (the reader; with `backfill`, `warm` and `spacing`, what
it keeps between ticks). `history` (whatif) and `memory` (preemption) read
through the same transport and decoder.
"""
