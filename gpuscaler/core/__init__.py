"""The functional core: purely computational, no I/O.

Nothing here reads a clock, opens a socket, touches a file or imports a Kubernetes or
Prometheus client. Observations come in as frozen data (`model`), forecasts are computed
(`forecast`), and the planner (`plan`) turns them, the config, the history and `now` into
a plan of decisions, each with its reason. Adapters (`gpuscaler.adapters`) carry it out.
"""
