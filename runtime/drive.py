"""The one run driver: a config (or a series of them) run start to end on an engine.

    execute(config, store, engine=None)      one run; builds and shuts its engine down unless
                                             given one (a calibration's probes share theirs)
    run_series(configs, store, ...)          one after another, each on its own engine, shut
                                             down before the next starts (never two engines'
                                             memory at once); hooks before and after each

The console's RunHost, `metronome run` and the gateway build their Runner themselves: each
holds it while it runs (live changes, signals, a socket's clients)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from runtime.config import RunConfig
from runtime.loop import Runner
from runtime.run_summary import RunSummary


def make_engine(config: RunConfig, store=None):
    """The engine a RunConfig asks for; the twin takes the latest fitted cost model if any."""
    from engine import create_engine

    cost = None
    if config.engine == "twin" and store is not None:
        cost = latest_cost_model(store)
    return create_engine(config.engine, config.engine_config(), cost, paced=config.paced)


def latest_cost_model(store):
    from engine.twin import CostModel
    from store.queries import latest_twin_model

    row = latest_twin_model(store.cursor())
    if row is None:
        return None
    return CostModel(row["a_ms"], row["b_ms_per_token"], row["c_ms_per_resident_token"],
                     source=str(row["source_run_id"]))


def execute(config: RunConfig, store, engine=None) -> RunSummary:
    """Run one experiment start to end; builds and shuts down the engine unless given one."""
    own = engine is None
    engine = engine or make_engine(config, store)
    try:
        return Runner(config, engine, store).run()
    finally:
        if own:
            engine.shutdown()


def run_series(configs: Iterable[RunConfig], store, *,
               engine_factory: Callable[[RunConfig, object], object] = make_engine,
               before: Callable[[int, RunConfig], None] | None = None,
               after: Callable[[RunSummary], None] | None = None) -> list[RunSummary]:
    """Run `configs` in order, each on a fresh engine from `engine_factory(config, store)`;
    returns their summaries. `before(index, config)` runs as each starts (progress),
    `after(summary)` once each has ended."""
    summaries = []
    for index, config in enumerate(configs):
        if before is not None:
            before(index, config)
        engine = engine_factory(config, store)
        try:
            summaries.append(execute(config, store, engine))
        finally:
            engine.shutdown()
        if after is not None:
            after(summaries[-1])
    return summaries
