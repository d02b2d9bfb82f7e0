"""The runtime ties load, admission, engine, telemetry and control together (app → runtime)."""

from engine import ENGINES
from runtime.config import ADMISSIONS, RunConfig
from runtime.loop import Runner


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


def execute(config: RunConfig, store, engine=None) -> dict:
    """Run one experiment start to end; builds and shuts down the engine unless given one."""
    own = engine is None
    engine = engine or make_engine(config, store)
    try:
        return Runner(config, engine, store).run()
    finally:
        if own:
            engine.shutdown()


__all__ = ["ADMISSIONS", "ENGINES", "RunConfig", "Runner", "execute", "latest_cost_model",
           "make_engine"]
