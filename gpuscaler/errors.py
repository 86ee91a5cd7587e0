"""gpuscaler's error tree: what the command line's one error path turns into an exit code.

    Exception
    ├── InputError            bad input the user can fix; exit 2
    │   ├── ConfigError           config/loading.py: the config file, every problem with its path
    │   ├── TraceError            sim/trace.py: a load trace
    │   ├── BacktestError         backtest/series.py: a series to backtest
    │   └── SetupError            setup.py: arguments that do not fit together, no API
    ├── OutsideError          something outside gpuscaler failed; exit 1
    │   ├── KubeError             adapters/kube/api.py: an API call, naming the object
    │   └── SourceError           adapters/prometheus/transport.py: a query (secrets scrubbed)
    └── anything else         a bug in gpuscaler; exit 1, traceback only with --debug

An OSError (a file that cannot be written, a port in use) counts as an outside failure.
"""

from __future__ import annotations


class InputError(Exception):
    """Bad input: the message names what is wrong and where."""


class OutsideError(Exception):
    """A failure of a system gpuscaler talks to; the message is safe to print."""
