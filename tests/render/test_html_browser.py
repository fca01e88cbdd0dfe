"""report.html as a person sees it: rendered by headless Chromium, offline.

Checks that the page loads, that every embedded plot decodes to a real image, that the page
fetches nothing, and that a screenshot of it is not blank. Skips only when no Chromium is
installed (Debian: `apt-get install chromium chromium-driver`; see .ci/run).
"""
import os
import re
import shutil
import subprocess

import pytest
from PIL import Image
from synthetic_results import synthetic_results

from verify.render import write_report

pytestmark = pytest.mark.slow   # renders in headless Chromium

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]
# Appended to a copy of the page only: the report itself carries no script.
PROBE = """<script>
window.addEventListener("load", () => {
  const images = [...document.images];
  const b = document.body;
  b.setAttribute("data-images", images.length);
  b.setAttribute("data-decoded", images.filter(i => i.complete && i.naturalWidth > 0).length);
  b.setAttribute("data-fetched", performance.getEntriesByType("resource").length);
  b.setAttribute("data-sections", document.querySelectorAll("section.pair").length);
});
</script></body>"""


def chromium() -> str:
    found = os.environ.get("PARITY_CHROMIUM") or next(
        (path for path in map(shutil.which, BROWSERS) if path), None)
    if not found:
        pytest.skip("no Chromium found (tried PARITY_CHROMIUM and " + ", ".join(BROWSERS)
                    + "); install it with `apt-get install chromium chromium-driver`")
    return found


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    directory = tmp_path_factory.mktemp("report")
    write_report(directory, synthetic_results(pairs=3, tensors=6, steps=8, failing=1))
    return directory / "report.html"


def run_browser(tmp_path, *args) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    return subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120)


def test_report_loads_offline_with_every_plot_decoded(report, tmp_path):
    probe = tmp_path / "probe.html"
    probe.write_text(report.read_text().replace("</body>", PROBE))
    result = run_browser(tmp_path, "--virtual-time-budget=5000", "--dump-dom", probe.as_uri())
    assert result.returncode == 0, result.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", result.stdout)
    assert body, result.stdout[:500]
    facts = dict(re.findall(r'data-(\w+)="(\d+)"', body.group(1)))
    assert facts == {"images": "3", "decoded": "3", "fetched": "0", "sections": "3"}, facts
    assert "Uncaught" not in result.stderr


def test_screenshot_shows_the_banner_and_plots(report, tmp_path):
    shot = tmp_path / "shot.png"
    result = run_browser(tmp_path, "--window-size=1200,1600", f"--screenshot={shot}",
                         report.as_uri())
    assert result.returncode == 0 and shot.is_file(), result.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (1200, 1600)
    pixels = list(image.getdata())
    not_white = sum(1 for p in pixels if min(p) < 235) / len(pixels)
    assert not_white > 0.05, f"page looks blank: {not_white:.1%} non-white pixels"
    top = image.crop((0, 0, 1200, 200))
    banner_red = sum(1 for r, g, b in top.getdata() if r > 170 and g < 80 and b < 80)
    assert banner_red > 5000, "the red FAIL banner is not drawn at the top"
    colors = image.getcolors(maxcolors=1 << 16)
    assert colors is None or len(colors) > 50, "too few colours for a page with plots"


FILTER_PROBE = """<script>
window.addEventListener("load", () => {
  const visible = v => [...document.querySelectorAll("tr.v-" + v)]
    .filter(r => r.getClientRects().length > 0).length;
  const b = document.body;
  b.setAttribute("data-pass-before", visible("PASS"));
  b.setAttribute("data-fail-before", visible("FAIL"));
  document.getElementById("show-PASS").click();
  b.setAttribute("data-pass-after", visible("PASS"));
  b.setAttribute("data-fail-after", visible("FAIL"));
});
</script></body>"""


def test_the_verdict_filters_hide_and_show_pairs_in_the_browser(report, tmp_path):
    """Unticking PASS hides the passing pairs of every case and nothing else, with the page's
    CSS alone (the probe only clicks, as a reader would)."""
    probe = tmp_path / "filters.html"
    probe.write_text(report.read_text().replace("</body>", FILTER_PROBE))
    result = run_browser(tmp_path, "--virtual-time-budget=5000", "--dump-dom", probe.as_uri())
    assert result.returncode == 0, result.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", result.stdout)
    facts = dict(re.findall(r'data-([\w-]+)="(\d+)"', body.group(1)))
    assert facts == {"pass-before": "2", "fail-before": "1", "pass-after": "0",
                     "fail-after": "1"}, facts
