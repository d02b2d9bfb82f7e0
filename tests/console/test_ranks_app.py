"""Data parallelism in the console and on the metrics endpoint: one occupancy line per rank,
the stalled rank named, per-rank series a router can read."""

from __future__ import annotations

import pandas as pd
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services import charts
from console import views
from metrics import MetricsExporter
from benchmarks.placement_scaling import skew_trace
from engine.twin import CostModel, TwinEngine
from runtime import RunConfig, Runner
from store.queries import run_row


def _skew_config(trace, placement="count"):
    return RunConfig(engine="twin", pool_blocks=64, duration_s=10.0, load="replay",
                     replay_trace=trace, data_parallel_size=2, placement=placement)


class _ScrapeAt:
    def __init__(self, registry, at_s):
        self.registry, self.at_s, self.text = registry, at_s, None

    def observe(self, table, row):
        if table == "ticks" and self.text is None and row["t"] >= self.at_s:
            self.text = generate_latest(self.registry).decode()


def _samples(text, name, run_id):
    return {s.labels.get("rank"): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name and s.labels["run_id"] == run_id}


def test_the_metrics_endpoint_carries_the_rank(store, tmp_path):
    registry = CollectorRegistry()
    exporter = MetricsExporter()
    registry.register(exporter)
    cfg = _skew_config(skew_trace(tmp_path / "skew.csv"))
    scrape = _ScrapeAt(registry, at_s=7.2)  # rank 0 stalled since about 7 s
    runner = Runner(cfg, TwinEngine(cfg.engine_config(), CostModel()), store,
                    observers=[exporter, scrape])
    exporter.run_started_for(runner.run_id, cfg)
    summary = runner.run()
    rid = runner.run_id
    assert _samples(scrape.text, "metronome_rank_stalled", rid) == {"0": 1.0, "1": 0.0}
    occ = _samples(scrape.text, "metronome_rank_pool_occupancy_ratio", rid)
    assert occ["0"] == 1.0 and occ["1"] < 0.2
    assert _samples(scrape.text, "metronome_pool_occupancy_ratio", rid)[None] < 0.6
    tsat = _samples(scrape.text, "metronome_rank_tsat_seconds", rid)
    assert set(tsat) == {"0", "1"}
    after = generate_latest(registry).decode()
    silent = _samples(after, "metronome_rank_silent_frames_total", rid)
    assert silent == {"0": summary["ranks"][0]["silent_frames"]} and silent["0"] > 0


def test_the_live_view_draws_a_line_per_rank_and_names_the_stalled_one(store, tmp_path):
    cfg = _skew_config(skew_trace(tmp_path / "skew.csv"))
    summary = Runner(cfg, TwinEngine(cfg.engine_config(), CostModel()), store).run()
    store.writer.flush()
    cur = store.cursor()
    data = views.live_data(cur, run_row(cur, summary["run_id"]))
    assert sorted(data.ranks["rank"].unique()) == [0, 1]
    text = views.stalled_rank_text(data.ranks)
    assert text.startswith("Stalled: rank 0 from") and "rank 1" not in text
    mean = float(text.rsplit("read ", 1)[1].split()[0])
    assert mean < 0.6  # the average the full rank hides behind
    spec = charts.rank_occupancy_chart(data.ranks, data.x_domain).to_dict()
    assert spec["title"] == "KV pool occupancy per rank (red: stalled)"
    assert views.stall_text(summary) == f"{summary['stall_at_s']:.1f} s (rank 0)"
    assert views.stalled_rank_text(data.ranks.assign(stalled=False)) is None
    assert charts.rank_occupancy_chart(pd.DataFrame()).to_dict()["title"]
