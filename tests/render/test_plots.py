"""The pair figures of report.html: one plotter draws every pair, and each pair's figure is the
one a fresh plotter draws for it alone, whatever was drawn before it. No TensorFlow."""
from synthetic_results import synthetic_results

from verify.render.plots import PairPlotter


def figures(results, order):
    """The PNG of each pair in `order` (indexes into results.pairs; an index past the last pair
    draws the first pair with no drift rows and no losses), all drawn by one plotter."""
    pairs = results.pairs
    pngs = []
    with PairPlotter() as plotter:
        for n in order:
            p = pairs.iloc[n % len(pairs)]
            mine = ((results.rows["candidate"] == p["candidate"])
                    & (results.rows["replicas"] == p["replicas"]))
            rows = results.rows[mine] if n < len(pairs) else results.rows.iloc[:0]
            losses = (results.losses[results.losses["candidate"] == p["candidate"]]
                      if n < len(pairs) else results.losses.iloc[:0])
            first = int(p["first_step"]) if p["first_step"] == p["first_step"] \
                and p["first_step"] is not None else None
            pngs.append(plotter.pair_png(rows, losses, p["reference"], p["candidate"], first))
    return pngs


def test_a_reused_plotter_draws_each_pair_as_a_fresh_one_does():
    # pair 0 fails (a first divergence, a failing mark, a log scale), 1 and 2 pass with other
    # drifts; 3 is pair 0 without drift rows or losses (a linear scale and text only)
    results = synthetic_results(pairs=3, tensors=3, steps=6, failing=1)
    order = [0, 3, 1, 0, 2, 3, 0]
    reused = figures(results, order)
    for n, png in zip(order, reused):
        assert png == figures(results, [n])[0], f"pair {n} drawn after others differs"
    assert len({reused[0], reused[1], reused[2]}) == 3, "the pairs' figures are not distinct"
