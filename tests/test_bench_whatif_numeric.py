"""How bench/whatif_numeric.py reads `perf report` (issue 20: the arithmetic under the
gate). The symbols are as perf 6.1 printed them for a lockstep of 40 lanes here (numpy
2.x's loops: numpy/_core/src/umath/loops_*.dispatch.c.src, npysort's x86-simd-sort,
einsum_sumprod.c.src, lowlevel_strided_loops.c.src)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))
from whatif_numeric import kind, tally

NUMPY = "_multiarray_umath.cpython-311-x86_64-linux-gnu.so"

REPORT = f"""# To display the perf.data header info, please use --header/--header-only options.
#
# Samples: 4K of event 'cpu-clock:pppH'
# Event count (approx.): 9619238400
#
# Overhead  Shared Object                                      Symbol
# ........  .................................................  ..................
#
    12.25%  libpython3.11.so.1.0                               [.] _PyEval_EvalFrameDefault
     4.40%  libc.so.6                                          [.] __memmove_avx512_unaligned_erms
     2.17%  {NUMPY}  [.] sort_n_vec<zmm_vector<double>, Comparator<zmm_vector<double>, false>, 32, double __vector(8)>
     2.06%  {NUMPY}  [.] DOUBLE_add_X86_V3
     1.71%  {NUMPY}  [.] _aligned_strided_to_contig_size8
     1.46%  {NUMPY}  [.] ufunc_generic_fastcall
     1.25%  {NUMPY}  [.] double_sum_of_products_contig_contig_outstride0_two
     0.62%  [kernel.kallsyms]                                  [k] exc_page_fault
            |
            |--0.96%--0x7f2e6c0a5200
"""


@pytest.mark.parametrize(
    ("dso", "symbol", "space", "expected"),
    [
        (NUMPY, "DOUBLE_add_X86_V3", ".", "arithmetic"),
        (NUMPY, "DOUBLE_isfinite", ".", "arithmetic"),
        (NUMPY, "LONG_maximum_X86_V4", ".", "arithmetic"),
        (NUMPY, "double_sum_of_products_contig_contig_outstride0_two", ".", "arithmetic"),
        (
            NUMPY,
            "sort_n_vec<zmm_vector<double>, Comparator<zmm_vector<double>, false>>",
            ".",
            "arithmetic",
        ),
        (NUMPY, "npy_binsearch<npy::double_tag, (side_t)0>", ".", "arithmetic"),
        ("libm.so.6", "__exp_fma", ".", "arithmetic"),
        ("libopenblas.so.0", "dgemm_kernel_HASWELL", ".", "arithmetic"),
        (NUMPY, "_aligned_strided_to_contig_size8", ".", "copy"),
        (NUMPY, "raw_array_assign_array", ".", "copy"),
        (NUMPY, "mapiter_get", ".", "copy"),
        (NUMPY, "PyArray_Where", ".", "copy"),
        ("libc.so.6", "__memmove_avx512_unaligned_erms", ".", "copy"),
        ("libc.so.6", "__memset_avx512_unaligned_erms", ".", "copy"),
        (NUMPY, "ufunc_generic_fastcall", ".", "overhead"),
        (NUMPY, "PyArray_NewFromDescr_int", ".", "overhead"),
        (NUMPY, "promote_and_get_info_and_ufuncimpl", ".", "overhead"),
        (NUMPY, "PyUFunc_DefaultLegacyInnerLoopSelector", ".", "overhead"),
        (NUMPY, "array_dealloc", ".", "overhead"),
        ("libc.so.6", "_int_malloc", ".", "overhead"),
        ("libpython3.11.so.1.0", "_PyEval_EvalFrameDefault", ".", "overhead"),
        ("libpython3.11.so.1.0", "memmove_like_name", ".", "overhead"),
        ("[kernel.kallsyms]", "exc_page_fault", "k", "overhead"),
    ],
)
def test_a_sample_is_arithmetic_only_in_an_inner_loop(
    dso: str, symbol: str, space: str, expected: str
) -> None:
    assert kind(dso, symbol, space) == expected


def test_a_report_is_tallied_from_its_sample_lines_alone() -> None:
    shares = tally(REPORT)
    total = 12.25 + 4.40 + 2.17 + 2.06 + 1.71 + 1.46 + 1.25 + 0.62
    assert shares["arithmetic"] == pytest.approx((2.17 + 2.06 + 1.25) / total)
    assert shares["copy"] == pytest.approx((4.40 + 1.71) / total)
    assert shares["overhead"] == pytest.approx((12.25 + 1.46 + 0.62) / total)
    assert sum(shares.values()) == pytest.approx(1.0)


def test_a_report_without_samples_is_all_overhead() -> None:
    assert tally("# Samples: 0\n#\n") == {"arithmetic": 0.0, "copy": 0.0, "overhead": 1.0}
