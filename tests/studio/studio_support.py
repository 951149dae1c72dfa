"""Helpers shared by the studio tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--autoplay-policy=no-user-gesture-required"]
# Against an external studio (MAGI2STUDIO_URL) the screenshots go to MAGI2STUDIO_SCREENSHOTS.
IMAGES = Path(os.environ.get("MAGI2STUDIO_SCREENSHOTS") or Path(__file__).resolve().parents[2] / "docs" / "images")
NO_CHROMIUM = ("Debian's chromium is not installed at /usr/bin/chromium (apt-get install chromium; .ci/run does)")


@contextmanager
def chromium_page(width: int = 1440, height: int = 1000):
    """A page in headless Debian Chromium at ``width`` x ``height``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)
        context = browser.new_context(viewport={"width": width, "height": height})
        try:
            yield context.new_page()
        finally:
            context.close()
            browser.close()


def wait_settled(page, element_id: str, timeout_ms: int = 30_000) -> None:
    """Wait until no event is pending on the component (Gradio fades it meanwhile: a screenshot would be grey)."""
    page.wait_for_function(
        "id => { const t = document.querySelector(`#${id} [data-testid=status-tracker]`);"
        " return !t || t.classList.contains('hide'); }", arg=element_id, timeout=timeout_ms)


# Small enough to keep the suite quick on two cores; the timing metric needs steps >= 3.
FAST_STEPS = 3


def generate_args(**overrides: Any) -> dict[str, Any]:
    """Every parameter of the /generate endpoint, as the page sends them by default."""
    args = {
        "mode": "t2va", "prompt": "A red kite over a grey sea; gulls cry, wind in the lines.",
        "prompt_file": None, "image": None, "negative_prompt": "", "seed": 7, "tier": "272p",
        "steps": FAST_STEPS, "refiner_steps": None, "video_cfg": 5.0, "audio_cfg": 7.0,
        "compile": "engine default", "deterministic": True, "output_width": "", "output_height": "",
        "layout_preset": "sp1-cfg1", "sp": 1, "cfg": 1,
        "ep": None,
    }
    args.update(overrides)
    return args


def everything_under(root: Path) -> set[str]:
    """Every path under the outputs root, hidden temp folders included."""
    return {str(p.relative_to(root)) for p in Path(root).rglob("*")}
