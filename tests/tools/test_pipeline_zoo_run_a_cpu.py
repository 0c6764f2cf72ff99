"""Every pipeline zoo case runs eagerly on the CPU at its tiny size (half 1 of 2: cases 0, 2, 4, ...; the
other half is test_pipeline_zoo_run_b_cpu.py, so that two xdist workers share them)."""

import pytest

from _pipeline_zoo import check_ran, half

CASES = half(0)


@pytest.mark.parametrize("case", CASES, ids=[case.pipeline for case in CASES])
def test_case_builds_and_runs_eagerly(case):
    check_ran(case)
