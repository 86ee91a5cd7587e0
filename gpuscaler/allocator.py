"""glibc's malloc told to keep the memory a replay frees for its next arrays (issue 20).

A replay's tick makes and drops numpy temporaries of ~0.1-2 MB by the thousand. glibc
serves a block above its mmap threshold (128 KB at start, raised to the size of the last
such block freed, at most 32 MB: `DEFAULT_MMAP_THRESHOLD_MAX`) with a fresh mapping, and
hands the top of its heap back to the kernel once more than the trim threshold (twice the
mmap threshold) is free there: either way the next array of that size starts on pages the
kernel must fault in and zero again. Measured on a 40-lane what-if lockstep, 3 h at 10 s
slots (`bench/lockstep.py`'s workloads, four alternated runs): 61,000 minor faults and
4.7-5.2 user + 0.14-0.19 system CPU-s without this, 4,500 faults and 4.6-5.0 + 0.01-0.04 with
it, the peak RSS the same (122 / 121 MB): the freed blocks are reused, not added to.

The thresholds are set with `mallopt` (glibc `malloc/malloc.c`: `do_set_mmap_threshold`,
`do_set_trim_threshold`; setting either also turns glibc's own moving of them off), the
same as the `MALLOC_MMAP_THRESHOLD_` and `MALLOC_TRIM_THRESHOLD_` environment variables,
which a running process can no longer use. Only the offline replays (`simulate`,
`whatif` and its worker processes, `backtest`) call it: a long-running controller keeps
glibc's defaults, which give freed memory back.
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""`mallopt` parameters (glibc `malloc/malloc.h`)."""
MMAP_THRESHOLD = 256 << 20
"""Blocks below 256 MB come from the heap, so that freeing them keeps their pages."""
TRIM_THRESHOLD = 1 << 30
"""The heap's free top is given back to the kernel only beyond 1 GB."""


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; False where the C library
    has no `mallopt` (not glibc) or refuses a value (the replay then runs as before)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
