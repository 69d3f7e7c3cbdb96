"""Run plots: one shared plotting function draws the training and the reward-model curves."""
from __future__ import annotations

import pytest

from upslope.logs.plot import plot_curves, plot_run
from upslope.train.trainers.rm import plot_pairwise

pytest.importorskip("matplotlib")

RECORDS = ([{"step": i, "reward/mean": i / 10, "accuracy": i / 20, "rm/accuracy": 0.5 + i / 40} for i in range(1, 6)]
           + [{"step": 0, "eval/accuracy": 0.1, "eval/rm_accuracy": 0.5}, {"step": 5, "eval/accuracy": 0.8}])


@pytest.mark.parametrize("draw", [lambda out: plot_run(RECORDS, out, "run"),
                                  lambda out: plot_pairwise(RECORDS, out, "rm")], ids=["run", "pairwise"])
def test_plots_are_written_as_png(draw, tmp_path):
    out = draw(tmp_path / "p.png")
    assert out == tmp_path / "p.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_curves_draws_only_the_keys_present(tmp_path):
    import matplotlib.pyplot as plt

    drawn = []
    real_plot = plt.Axes.plot

    def spy(self, *args, **kw):
        drawn.append((kw.get("label"), list(args[0]), list(args[1]), args[2] if len(args) > 2 else None))
        return real_plot(self, *args, **kw)

    plt.Axes.plot = spy
    try:
        plot_curves(RECORDS, tmp_path / "c.png", [("eval/rm_accuracy", "held", {"fmt": "o-"}),
                                                   ("missing/key", "never", {})])
    finally:
        plt.Axes.plot = real_plot
    assert drawn == [("held", [0], [0.5], "o-")]


def test_timeline_plot_draws_one_row_per_actor(tmp_path):
    """A pipeline run's timeline (two workers, one weight load, the learner, a push) becomes a PNG; no
    events: no file."""
    from upslope.logs.plot import plot_timeline

    events = [{"who": "worker0", "start": 0.0, "end": 2.0}, {"who": "worker1", "start": 0.5, "end": 1.5},
              {"who": "worker0", "kind": "load", "start": 3.1, "end": 3.4},
              {"who": "learner", "start": 2.0, "end": 3.0}, {"who": "push", "start": 3.0, "end": 3.1}]
    out = plot_timeline(events, tmp_path / "t.png", title="t")
    assert out is not None and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_timeline([], tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()
