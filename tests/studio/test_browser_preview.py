"""The live preview in Debian's Chromium at 1440x900: while a run denoises, the newest picture of its
clean-video estimate appears beside the progress, moves on with the steps, and is back after a reload.
Its screenshot goes to docs/images/studio-live-preview.png (the committed one shows random tiny weights'
estimate, which decodes to coloured noise; under MAGI2_EMBEDDED_WEIGHTS=trained it is a picture)."""

from __future__ import annotations

import pytest

from studio_support import CHROMIUM, IMAGES, submit_from_the_page

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed at /usr/bin/chromium "
                                                     "(apt-get install chromium; .ci/run does)"),
]


def test_the_preview_appears_beside_the_progress_and_survives_a_reload(studio, page):
    submit_from_the_page(page, studio.url, "A red ball bounces left to right on a blue floor; a beep at each bounce.",
                         9801, 20, preview_every=2)
    picture = page.locator("#live-preview-image")
    picture.wait_for(timeout=180_000)
    first_step = int(page.locator("#live-preview figure").get_attribute("data-step"))
    progress, preview = page.locator("#progress").bounding_box(), picture.bounding_box()
    # Beside the progress: just under it, in the same column.
    assert 0 <= preview["y"] - (progress["y"] + progress["height"]) < 120
    assert progress["x"] <= preview["x"] < progress["x"] + progress["width"]
    assert page.evaluate("document.getElementById('live-preview-image').naturalWidth") > 0
    page.wait_for_function(f"Number(document.querySelector('#live-preview figure').dataset.step) > {first_step}",
                           timeout=300_000)  # it moves on with the steps
    # The progress line and the whole picture in the shot (if-needed scrolling left the picture cut at the bottom).
    page.locator("#live-preview figure").evaluate("e => e.scrollIntoView({block: 'center'})")
    IMAGES.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(IMAGES / "studio-live-preview.png"))
    page.reload()
    page.locator("#live-preview-image").wait_for(timeout=30_000)
    assert "step" in page.locator("#live-preview figcaption").inner_text()
