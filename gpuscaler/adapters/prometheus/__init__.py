"""Prometheus source: dcgm-exporter series, aggregated by Prometheus, fetched incrementally
by one read path (its modules: docs/architecture.md). `history` (whatif) and `memory`
(preemption) read through the same transport and decoder.
"""
