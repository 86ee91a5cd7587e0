"""Prometheus source: dcgm-exporter series, aggregated by Prometheus, fetched incrementally.

Four parts, kept apart (unlike a one-method scraper):
- PromQL: label values escaped into matchers; `Hostname` also tried as `hostname`.
- Transport: auth (bearer token file re-read on change, basic auth), TLS (CA, client
  certificate, explicit insecure), timeouts, bounded retries with backoff; errors become
  `SourceError` with every secret scrubbed from the message.
- Decoding: the `data.result` matrix checked for shape; values parsed, NaN/Inf flagged.
- Window: per target a sliding window on the step grid; the first cycle backfills in
  chunks under Prometheus' 11,000-points-per-series limit, later cycles fetch only what is
  new (plus a small overlap for late samples); gaps stay NaN; memory is window x targets.

Failure policy: any failure for a target sets its `problem`, so the core takes no action
on it and says why; the source's health records the last error; the next good fetch
recovers by itself.
"""
