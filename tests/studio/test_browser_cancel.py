"""Issue 29's audit, "a cancel the user asked for ... took 14 s": in Debian's Chromium, a cancel of a running job
lands at the step boundary of the step that runs when Cancel is clicked (a promise in steps, not a benchmark: on a
loaded 2-core machine one step of the embedded engine took from 0.9 to 40 s, docs/studio.md), with no red
"Error" toast, and the progress line says cancelled. Prints the click -> cancelled seconds."""

from __future__ import annotations

import re
import time

import pytest

from studio_support import CHROMIUM, NO_CHROMIUM, submit_from_the_page

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)]

STEPS = 400
# The step the line shows at the click may already be over in the engine (the line follows the stream): the cancel
# lands after the running step, at most two steps past the one shown. Three is the guard.
GUARD_STEPS = 3
STEP_SHOWN = re.compile(rf"preview: step (\d+)/{STEPS}")


def test_a_cancel_mid_run_lands_within_a_few_steps_with_no_error_and_the_line_says_cancelled(studio, page):
    submit_from_the_page(page, studio.url, "Waves fold over a breakwater; a foghorn, far off.", 9801, STEPS)
    progress = page.locator("#progress")
    progress.get_by_text(re.compile(rf"preview: step [3-9]/{STEPS}")).wait_for(timeout=600_000)  # past warm-up
    shown = int(STEP_SHOWN.search(progress.inner_text()).group(1))
    asked = time.monotonic()
    page.locator("#cancel").click()
    progress.get_by_text(re.compile(r"^cancelled at a step boundary")).wait_for(timeout=600_000)
    took = time.monotonic() - asked
    line = progress.inner_text()
    stopped = int(re.search(rf"after preview step (\d+)/{STEPS}", line).group(1))
    assert shown <= stopped <= shown + GUARD_STEPS, f"shown step {shown} at the click, stopped after {stopped}: {line}"
    assert "Error" not in line
    page.locator("#job-panel tr", has_text="seed 9801 ").locator("td", has_text=re.compile(r"^cancelled$")).wait_for(
        timeout=30_000)
    page.wait_for_timeout(1500)  # a late toast would show by now
    toasts = page.locator("[data-testid=toast-body]").all_inner_texts()
    assert not any("Error" in text for text in toasts) and not toasts, toasts
    print(f"cancel: {took:.1f} s from the click to 'cancelled' on the progress line "
          f"(step {shown}/{STEPS} shown at the click, stopped after step {stopped})")
