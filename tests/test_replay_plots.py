"""The replay report's plots."""

from __future__ import annotations

from mxsim.replay.plots import plot_ceiling


def test_the_plot_ceiling_is_shared_by_every_unit():
    # one unit identical everywhere (inf), another with finite rows: inf is drawn above them all
    assert plot_ceiling([float("inf"), float("inf"), 40.0, 75.5]) == 85.5
    assert plot_ceiling([float("inf")]) == 200.0
