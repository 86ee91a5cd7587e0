"""Prometheus source: dcgm-exporter series, aggregated by Prometheus, fetched incrementally.

One read path, in parts kept apart:
- `promql`: label values escaped into matchers; `Hostname` also tried as `hostname`.
- `plan`: what a tick asks, few grouped queries and per-target ones for the rest;
  `rules`: which pools are read from the shipped pool recording rules.
- `fetch`: the queries on one thread pool kept for the process, at most
  `prometheus.max_concurrent_queries` at a time.
- `transport`: one HTTP GET per query, decoded by orjson; auth, TLS, timeouts, bounded
  retries; errors become `SourceError` with every secret scrubbed from the message.
- `window`: the one decoder (shape checked, every value parsed, NaN/Inf flagged, values
  out of their physical range named), run on the thread that fetched the answer, and per
  target a window of `forecast.fit_step` buckets (sum and count of the samples) with the
  few newest samples raw, so a sample read again is counted once.
- `source`: the reader; `backfill`, `warm`, `total`, `spacing`: what it keeps between ticks.
- `history` (whatif) and `memory` (preemption) read through the same transport.

Failure policy: any failure for a target sets its `problem`, so the core takes no action
on it and says why; the source's health records the last error; the next good fetch
recovers by itself.
"""
