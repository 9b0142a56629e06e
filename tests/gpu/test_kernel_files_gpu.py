"""One call per compiled kernel file: for every (head dims, dtype) kernel set the wheel's
build info lists, FA3 and FA2, each call shape that upstream's dispatch sends to a file of
its own (gpu_helpers.FA3_CALL_SHAPES, FA2_CALL_SHAPES), against the float64 reference.

The other suites test scenarios (lengths, layouts, masks, FP8 scales) at one head dim; a
`full` slice compiles 8-10 FA3 files per head dim and dtype and 6 FA2 ones, which only
these calls reach at every head dim (tests/gpu/kernel_coverage.py found the rest unrun on
the H200: the softcap files with paged or split K/V, head dim 256's paged and split files,
FA2's non-causal head dim 256). tests/unit/test_kernel_files.py checks on CPU that the
expected files of these calls are every FA3 and FA2 unit of each slice of `full`.
"""

from __future__ import annotations

import pytest

from gpu_helpers import CALL_SHAPES, chunked_lengths, kernel_file, kernel_sets, make_problem, require, run_checked
from kernel_log import EXPECTS

pytestmark = pytest.mark.gpu


def cases(version: int):
    return [pytest.param(head_dim, head_dim_v, dtype, shape,
                         id=f"hd{head_dim}{'' if head_dim == head_dim_v else f'_{head_dim_v}'}-{dtype}-{shape.name}")
            for head_dim, head_dim_v, dtype in kernel_sets(version) for shape in CALL_SHAPES[version]]


def run_shape(rng, record_property, version: int, head_dim: int, head_dim_v: int, dtype: str, shape) -> None:
    require(version)
    # The unit this call must run: under VFA_KERNEL_LOG, kernel_coverage.py checks it ran.
    expected = kernel_file(version, head_dim, head_dim_v, dtype, shape)
    record_property(EXPECTS, expected)
    q_lens, k_lens = chunked_lengths(rng)
    p = make_problem(rng, dtype=dtype, num_heads=shape.heads[0], num_heads_k=shape.heads[1],
                     head_dim=head_dim, head_dim_v=head_dim_v, q_lens=q_lens, k_lens=k_lens,
                     page_size=shape.page_size)
    label = f"FA{version} {expected} ({shape.name})"
    run_checked(p, version, label, causal=shape.causal, softcap=shape.softcap, num_splits=shape.num_splits)


@pytest.mark.parametrize("head_dim,head_dim_v,dtype,shape", cases(3))
def test_fa3_kernel_file(rng, record_property, head_dim, head_dim_v, dtype, shape):
    run_shape(rng, record_property, 3, head_dim, head_dim_v, dtype, shape)


@pytest.mark.parametrize("head_dim,head_dim_v,dtype,shape", cases(2))
def test_fa2_kernel_file(rng, record_property, head_dim, head_dim_v, dtype, shape):
    run_shape(rng, record_property, 2, head_dim, head_dim_v, dtype, shape)
