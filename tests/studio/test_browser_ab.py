"""A/B's sides in Debian's Chromium (issue 29's audit: A/B took free-text ``env.KEY=VALUE`` lines): each side is
its own layout control, compile mode, deterministic box and environment, and a bad value is one red line under
its side, gone once the field changes."""

from __future__ import annotations

import pytest

from magi2studio.reproduction.ab import SIDES

from studio_support import CHROMIUM, NO_CHROMIUM

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)]


def test_each_side_has_its_own_fields_and_a_bad_one_is_a_line_under_its_side(studio, page):
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(studio.url)
    page.get_by_role("tab", name="A/B").click()
    for side in SIDES:
        for field in ("layout-preset", "compile", "deterministic", "env"):
            page.locator(f"#ab-{side}-{field}").wait_for(timeout=30_000)
    page.locator("#ab-candidate-layout-check").get_by_text("= the control's layout").wait_for(timeout=30_000)
    page.locator("#ab-control-layout-check").get_by_text("sp1-cfg1 runs on embedded").wait_for(timeout=30_000)

    page.locator("#ab-prompt textarea").fill("A kite over a grey sea")
    page.locator("#ab-candidate-env textarea").fill("MAGI2_KERNELS")
    page.locator("#ab-start").click()
    line = page.locator("#error-ab-candidate")
    line.get_by_text("candidate.environment: 'MAGI2_KERNELS' is not KEY=VALUE. Fix:").wait_for(timeout=60_000)
    assert line.locator(".m2s-refusal[role=alert]").count() == 1
    env_box, error = page.locator("#ab-candidate-env").bounding_box(), line.bounding_box()
    start = page.locator("#ab-start").bounding_box()
    assert env_box["y"] + env_box["height"] <= error["y"] < start["y"], "the refusal is not under the candidate"
    assert error["x"] >= page.locator("#ab-control-env").bounding_box()["x"] + 100, "the refusal is not the candidate's"
    assert page.locator("#error-ab-control").is_hidden() and page.locator("#error-ab-request").is_hidden()
    assert not page.locator("[data-testid=toast-body]").count(), "a toast as well as the line"
    page.locator("#ab-candidate-env textarea").fill("MAGI2_KERNELS=on")
    line.wait_for(state="hidden", timeout=10_000)
