"""`gpuscaler whatif`: what gpuscaler would have done on the user's own cluster, from its
Prometheus history. `history` replays histories through the simulator's model (pure, no
adapter), `verdict` compares the outcome with the baselines, `sizing` splits the replay
across processes and lanes within the memory, `progress` shows it on a terminal,
`command` reads and runs it and `report` words it."""

from gpuscaler.whatif.command import WhatifError, parse_when, run_whatif, select
from gpuscaler.whatif.report import text

__all__ = ["WhatifError", "parse_when", "run_whatif", "select", "text"]
