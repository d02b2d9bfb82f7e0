"""Prometheus metrics of the runs in this process: an observer the runner feeds row by row
(MetricsExporter), the process-wide instance and its HTTP endpoint (default_exporter, serve).
Alert rules and a Grafana dashboard over these names live in deploy/."""

from metrics.exporter import MetricsExporter
from metrics.run_state import (FRAME_LATENCY_BUCKETS_S, TICK_OVERRUN_BUCKETS_S,
                                   frame_censored)
from metrics.server import DEFAULT_PORT, check_port, default_exporter, serve, stop_serving

__all__ = ["DEFAULT_PORT", "FRAME_LATENCY_BUCKETS_S", "TICK_OVERRUN_BUCKETS_S",
           "MetricsExporter", "check_port", "default_exporter", "frame_censored", "serve",
           "stop_serving"]
