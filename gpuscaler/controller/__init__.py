"""The controller's shell: `tick` runs one tick (observe, forecast, plan, act, record) against
any source and actuator, `assembly` builds it against a real cluster, `loop` ticks it every
interval. The simulator ticks the same `Controller` against its model."""

from gpuscaler.controller.tick import Actuator, Controller, ObservationSource, TickResult, TickStats

__all__ = ["Actuator", "Controller", "ObservationSource", "TickResult", "TickStats"]
