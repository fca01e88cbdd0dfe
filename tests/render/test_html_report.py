"""report.html: self-contained, every pair in the overview, plots and first divergence per pair,
bounded in size. No TensorFlow; no browser (see test_html_browser.py for that)."""
import base64
import html.parser
import io
import time

from PIL import Image
from synthetic_results import synthetic_results

from verify.store.history import compare_runs, run_record
from verify.render import html as html_report
from verify.render.html import MAX_WORST_TENSORS, render_html, worst_tensors
from verify.render.plots import FIGURE_DPI, FIGURE_INCHES
from verify.store.results import RunResults


class PageParts(html.parser.HTMLParser):
    """Collects what a self-contained page must (images) and must not (fetches) contain."""

    def __init__(self):
        super().__init__()
        self.images, self.fetching, self.ids, self.links = [], [], set(), []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs.get("src", ""))
        if tag in ("script", "link", "iframe", "object", "embed", "video", "audio", "source"):
            self.fetching.append(tag)
        for name in ("src", "href"):
            value = attrs.get(name) or ""
            if value and not value.startswith(("data:", "#")):
                self.fetching.append(f"{tag} {name}={value[:40]}")
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href", "").startswith("#"):
            self.links.append(attrs["href"][1:])


def parse(page: str) -> PageParts:
    parts = PageParts()
    parts.feed(page)
    return parts


def decode_png(src: str) -> Image.Image:
    prefix = "data:image/png;base64,"
    assert src.startswith(prefix), src[:40]
    return Image.open(io.BytesIO(base64.b64decode(src[len(prefix):], validate=True)))


def test_page_is_self_contained_with_one_decodable_plot_per_pair():
    page = render_html(synthetic_results(pairs=3, tensors=4, failing=1))
    parts = parse(page)
    assert parts.fetching == []
    assert "http://" not in page and "https://" not in page
    assert len(parts.images) == 3
    for src in parts.images:
        image = decode_png(src)
        assert image.format == "PNG"
        width, height = (int(inches * FIGURE_DPI) for inches in FIGURE_INCHES)
        assert image.size == (width, height)
        assert len(image.convert("RGB").getcolors(256) or []) > 5   # not a blank image
    assert set(parts.links) <= parts.ids
    assert sorted(link for link in parts.links if link.startswith("pair-")) == [
        "pair-0", "pair-1", "pair-2"]
    assert sorted(link for link in parts.links if link.startswith("case-")) == [
        "case-0", "case-1", "case-2"]


def test_the_overview_groups_pairs_by_case_with_verdict_filters():
    """A table of the cases, then each case's pairs under its own heading; every pair row
    carries its verdict's class, which the filter checkboxes hide with CSS alone."""
    results = synthetic_results(pairs=6, tensors=2, steps=2, failing=2)
    page = render_html(results)
    cases = page[page.index("<h2>Cases</h2>"):page.index("<h2>Overview</h2>")]
    assert cases.count('<a href="#case-') == 4 and "no mutants run" in cases
    overview = page[page.index("<h2>Overview</h2>"):page.index("<h2>Pairs</h2>")]
    for n in range(4):
        heading = overview.index(f'<h3 id="case-{n}">case_{n}</h3>')
        following = overview[heading:].split("<h3", 2)[1]
        assert all(f"tf2-variant-{m:03d}" in following for m in range(n, 6, 4))
    assert overview.count('<tr class="v-FAIL">') == 2 and overview.count('<tr class="v-PASS">') == 4
    assert 'id="show-FAIL" checked' in overview and 'id="show-PASS" checked' in overview
    assert "body:has(#show-PASS:not(:checked)) tr.v-PASS{display:none}" in page
    assert "<script" not in page


def test_failing_pair_comes_first_with_its_first_divergence_and_reason():
    page = render_html(synthetic_results(pairs=3, tensors=4, failing=1))
    pairs = page.index("<h2>Pairs</h2>")
    first_section = page[pairs:page.index('id="pair-1"')]
    assert "tf2-variant-000" in first_section and "badge FAIL" in first_section
    assert "First divergence: step 2 grad layer_0000/kkkkkkkkkk" in first_section
    assert "Mismatched elements: 3 / 50" in first_section
    assert "<tr class=first>" in first_section   # the tensor that diverged first is marked


def test_every_pair_is_in_the_overview_but_only_some_are_plotted(monkeypatch):
    monkeypatch.setattr(html_report, "MAX_PLOTTED_PAIRS", 3)
    results = synthetic_results(pairs=8, tensors=2, steps=2, failing=0)
    page = render_html(results)
    assert len(parse(page).images) == 3
    overview = page[page.index("<h2>Overview</h2>"):page.index("<h2>Pairs</h2>")]
    assert all(f"tf2-variant-{n:03d}" in overview for n in range(len(results.pairs)))
    assert "5 more pairs are listed in the overview without plots" in page


def test_regressions_and_header_facts_are_shown():
    before = synthetic_results(pairs=2, failing=0)
    after = synthetic_results(pairs=2, failing=1)
    previous = run_record(before, run_id="night-1", timestamp="2024-01-01T00:00:00+00:00")
    current = run_record(after, run_id="night-2", provenance={"git_commit": "f" * 40})
    page = render_html(after, current, compare_runs(current, previous))
    assert "Since run night-1" in page and "PASS → FAIL" in page
    assert "f" * 40 in page and "night-2" in page


def test_no_results_and_a_pair_without_rows_still_render():
    assert "NO RESULTS" in render_html(RunResults.empty())
    results = synthetic_results(pairs=1, failing=0)
    empty = RunResults(results.rows.iloc[:0], results.pairs, results.losses.iloc[:0])
    page = render_html(empty)
    assert "0 drift rows" in page and len(parse(page).images) == 1


def test_worst_tensors_put_failing_then_furthest_past_tolerance():
    results = synthetic_results(pairs=1, tensors=20, failing=1)
    worst = worst_tensors(results.rows)
    assert len(worst) == MAX_WORST_TENSORS
    assert (worst.iloc[0]["quantity"], worst.iloc[0]["tensor"]) == ("grad", "layer_0000/kkkkkkkkkk")
    assert worst.iloc[0]["failed_steps"] == 4 and worst.iloc[0]["first_failed_step"] == 2
    assert (worst["failed_steps"].iloc[1:] == 0).all()


def test_size_and_render_time_stay_bounded_for_hundreds_of_tensors(monkeypatch):
    """Every pair's rows are summarised; only MAX_PLOTTED_PAIRS get a plot, so the page's size
    is about MAX_PLOTTED_PAIRS x one plot. 10 plotted here to keep the test short."""
    monkeypatch.setattr(html_report, "MAX_PLOTTED_PAIRS", 10)
    results = synthetic_results(pairs=60, tensors=300, steps=10, failing=10, name_length=60)
    assert len(results.rows) > 500_000
    started = time.perf_counter()
    page = render_html(results)
    seconds = time.perf_counter() - started
    size = len(page.encode())
    print(f"\n60 pairs x 300 tensors x 10 steps ({len(results.rows)} rows), 10 plotted: "
          f"{size / 1e6:.2f} MB in {seconds:.1f} s")
    images = parse(page).images
    assert len(images) == 10
    per_plot = sum(len(src) for src in images) / len(images)
    assert per_plot < 40_000
    assert size < 10 * per_plot + 400_000   # the rest: overview and tables, no per-tensor rows
    assert seconds < 60   # generous: the machine is shared; the measured figure is printed


def test_losses_of_one_side_only_are_drawn_without_error():
    results = synthetic_results(pairs=1, failing=0)
    one_sided = results.losses.assign(candidate_loss=float("nan"))
    page = render_html(RunResults(results.rows, results.pairs, one_sided))
    assert len(parse(page).images) == 1
