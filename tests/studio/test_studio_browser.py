"""A person's path through the studio in Debian's Chromium: fill the form, generate, watch the
10 s clip play with sound, see the timing plot; the screenshots go to docs/images/."""

from __future__ import annotations

import pytest

from studio_support import CHROMIUM, IMAGES, NO_CHROMIUM, wait_settled

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)]


def test_fill_generate_play_and_see_the_timing_plot(studio, page):
    IMAGES.mkdir(parents=True, exist_ok=True)
    page.goto(studio.url)
    page.locator("#prompt textarea").fill(
        "A lighthouse keeper climbs the spiral stairs at dusk; the lamp turns on, waves break below "
        "and a foghorn sounds twice.")
    page.locator("#seed input").fill("2026")
    page.locator("#steps input, #steps textarea").first.fill("4")
    page.locator("#layout-check").get_by_text("sp1-cfg1").first.wait_for()
    page.screenshot(path=str(IMAGES / "studio-generate.png"), full_page=True)

    tabs = page.get_by_role("tab").all_inner_texts()
    page.locator("#generate").click()
    video = page.locator("#result-video video")
    video.wait_for(state="attached", timeout=180_000)
    assert page.get_by_role("tab").all_inner_texts() == tabs, "switching to Results relabelled a tab"
    assert page.get_by_role("tab", name="Results").get_attribute("aria-selected") == "true"
    page.wait_for_function(
        "() => { const v = document.querySelector('#result-video video');"
        " return v && v.readyState >= 1 && Number.isFinite(v.duration); }", timeout=90_000)
    duration = video.evaluate("v => v.duration")
    assert duration == pytest.approx(10.0, abs=0.15)
    video.evaluate("v => { v.muted = false; return v.play(); }")
    page.wait_for_function(
        "() => { const v = document.querySelector('#result-video video');"
        " return v.currentTime > 1.0 && v.webkitAudioDecodedByteCount > 0; }", timeout=90_000)
    assert video.evaluate("v => v.webkitAudioDecodedByteCount") > 0, "the clip played without an audio track"

    plot = page.locator("#timing-plot")
    plot.locator("canvas, svg").first.wait_for(state="visible", timeout=90_000)
    box = plot.bounding_box()
    assert box is not None and box["height"] > 150
    assert "seed **2026**" not in page.locator("#run-headline").inner_text()  # rendered, not raw markdown
    assert "2026" in page.locator("#run-headline").inner_text()
    page.locator("#timing-summary").get_by_text("gate metric").filter(visible=True).first.wait_for(timeout=90_000)
    page.locator("#timing-summary").get_by_text("engine start").filter(visible=True).first.wait_for(timeout=30_000)
    video.evaluate("v => v.pause()")
    page.screenshot(path=str(IMAGES / "studio-results.png"), full_page=True)

    page.get_by_role("tab", name="History").click()
    page.locator("#history-gallery img").first.wait_for(state="visible", timeout=90_000)
    wait_settled(page, "history-gallery")
    page.screenshot(path=str(IMAGES / "studio-history.png"), full_page=True)

    # The replay path: change the form, pick the run in History, "Use these settings" refills it.
    page.get_by_role("tab", name="Generate").click()
    page.locator("#seed input").fill("1")
    page.get_by_role("tab", name="History").click()
    page.locator("#history-gallery img").first.click()
    page.locator("#history-open").click()
    page.locator("#use-settings").wait_for(state="visible", timeout=90_000)
    page.locator("#use-settings").click()
    page.wait_for_function("() => document.querySelector('#seed input').value === '2026'", timeout=90_000)
    assert page.locator("#steps input, #steps textarea").first.input_value() == "4"
    assert "lighthouse keeper" in page.locator("#prompt textarea").input_value()
