"""The runtime ties load, admission, engine, telemetry and control together (services → runtime)."""

from engine import ENGINES
from runtime.config import ADMISSIONS, RunConfig
from runtime.drive import execute, latest_cost_model, make_engine, run_series
from runtime.live_settings import LiveSettings
from runtime.loop import Runner

__all__ = ["ADMISSIONS", "ENGINES", "LiveSettings", "RunConfig", "Runner", "execute",
           "latest_cost_model", "make_engine", "run_series"]
