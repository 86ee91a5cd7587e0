"""The controller's shell (its modules: docs/architecture.md). The simulator ticks the same
`Controller` against its model."""

from gpuscaler.controller.tick import Actuator, Controller, ObservationSource, TickResult, TickStats

__all__ = ["Actuator", "Controller", "ObservationSource", "TickResult", "TickStats"]
