"""The Generate form, the timing plot and History as a newcomer meets them in Debian's Chromium at 1440x900:
layouts the engine refuses marked with the reason, a refusal shown once next to its field and gone when the
field changes, seed -1 giving a run whose manifest holds the drawn seed, a plot legend naming its series,
History searched and a run deleted. Screenshots of the plot and History go to docs/images/."""

from __future__ import annotations

import json
import re

import pytest

from studio_support import CHROMIUM, IMAGES, NO_CHROMIUM, chromium_page, wait_settled

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)]

FOLD = 900
# The WCAG contrast ratio of an element's text (or its ::placeholder) with the backgrounds under it.
CONTRAST = r"""([selector, pseudo]) => {
  const el = document.querySelector(selector);
  if (!el) return 0;
  const parse = c => { const p = c.match(/rgba?\(([^)]+)\)/)[1].split(',').map(Number);
                       return {r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1}; };
  const over = (top, under) => ({r: top.r * top.a + under.r * (1 - top.a), g: top.g * top.a + under.g * (1 - top.a),
                                 b: top.b * top.a + under.b * (1 - top.a), a: 1});
  const luminance = c => [c.r, c.g, c.b].map(v => { v /= 255; return v <= 0.03928 ? v / 12.92
                                                     : Math.pow((v + 0.055) / 1.055, 2.4); })
                                       .reduce((sum, v, i) => sum + v * [0.2126, 0.7152, 0.0722][i], 0);
  const layers = [];
  for (let n = el; n && n.nodeType === 1; n = n.parentElement) {
    const c = parse(getComputedStyle(n).backgroundColor);
    if (c.a > 0) layers.push(c);
    if (c.a >= 1) break;
  }
  const background = layers.reverse().reduce((under, top) => over(top, under), {r: 255, g: 255, b: 255, a: 1});
  let text = over(parse(getComputedStyle(el, pseudo).color), background);
  const [a, b] = [luminance(text), luminance(background)];
  return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
}"""


@pytest.fixture
def page(studio):
    with chromium_page(1440, FOLD) as page:
        page.goto(studio.url)
        page.locator("#layout-check").get_by_text("runs on").first.wait_for(timeout=60_000)
        yield page


def steps_box(page):
    return page.locator("#steps textarea, #steps input").first


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_labels_placeholders_help_and_footer_meet_wcag_aa(studio, scheme):
    with chromium_page(1440, FOLD) as page:
        page.emulate_media(color_scheme=scheme)
        page.goto(f"{studio.url}?__theme={scheme}")
        page.locator("#layout-check").get_by_text("runs on").first.wait_for(timeout=60_000)
        for selector, pseudo in [('#seed [data-testid="block-info"]', None),
                                 ("#steps input, #steps textarea", "::placeholder"),
                                 ("#layout-preset .info-text", None), ("footer a, footer button", None),
                                 ("#layout-check small", None)]:
            ratio = page.evaluate(CONTRAST, [selector, pseudo])
            assert ratio >= 4.5, f"{selector} {pseudo or ''} is {ratio:.2f}:1 in the {scheme} theme (0: not found)"


def test_layouts_the_engine_refuses_are_marked_with_the_reason_and_the_fields_follow_the_preset(page):
    preset = page.locator("#layout-preset input").input_value()
    name = preset.split(":")[0]
    sp, cfg = name.split("-")[0][2:], name.split("-")[1][3:]
    assert (page.locator("#layout-sp input").input_value(), page.locator("#layout-cfg input").input_value()) == (
        sp, cfg), f"the preset {name} and the SP / CFG fields disagree on first load"
    for element in ("#layout-check", "#generate"):
        box = page.locator(element).bounding_box()
        assert box is not None and box["y"] + box["height"] <= FOLD, f"{element} is below the fold at 1440x{FOLD}"

    page.locator("#layout-preset input").click()
    refused = page.locator('#layout-preset li[aria-label^="⊘ sp8-cfg1-ep4:"]')
    refused.wait_for(timeout=10_000)
    assert "at most 4 CPU processes" in refused.inner_text()
    runnable = page.locator('#layout-preset li[aria-label^="sp1-cfg1:"]')
    style = "e => getComputedStyle(e).fontStyle + ' ' + getComputedStyle(e).color"
    assert refused.evaluate(style) != runnable.evaluate(style), "a refused layout is not greyed"
    refused.click(force=True)  # a click cannot pick it: the dropdown keeps its layout
    page.wait_for_timeout(1000)
    assert page.locator("#layout-preset input").input_value() == preset, "a click picked a refused layout"
    verdict = page.locator("#layout-check")
    assert "✗" not in verdict.inner_text()
    page.keyboard.press("Escape")
    picked = page.locator("#layout-preset input")
    picked.fill("sp8-cfg1-ep4")  # Enter on the one option the typed text leaves (a refused one) does not take it
    picked.press("Enter")
    page.wait_for_timeout(1000)
    picked.press("Escape")
    picked.evaluate("e => e.blur()")
    page.wait_for_timeout(500)
    assert picked.input_value() == preset, "Enter picked a refused layout the typed text filtered to"
    picked.click()  # nor Enter on a refused option reached with the arrow keys
    refused.wait_for(timeout=10_000)
    for _ in range(30):
        active = picked.get_attribute("aria-activedescendant")
        if active and page.locator(f'[id="{active}"]').get_attribute("aria-label").startswith("⊘"):
            break
        picked.press("ArrowDown")
    else:
        raise AssertionError("the arrow keys never reached a refused layout")
    picked.press("Enter")
    page.wait_for_timeout(1000)
    picked.press("Escape")
    picked.evaluate("e => e.blur()")
    page.wait_for_timeout(500)
    assert picked.input_value() == preset, "Enter picked a refused layout reached with the arrow keys"
    assert "✗" not in verdict.inner_text()
    page.locator("#layout-preset input").click()
    page.locator('#layout-preset li[aria-label^="sp1-cfg1:"]').click()
    verdict.get_by_text("sp1-cfg1 runs on embedded").wait_for(timeout=10_000)
    assert "✗" not in verdict.inner_text(), "an old verdict stayed under the new one"


def test_the_ep_placeholder_fits_its_field(page):
    """The audit: the EP field's placeholder was clipped on first load."""
    needs, room = page.evaluate("""() => {
      const box = document.querySelector('#layout-ep textarea, #layout-ep input'), style = getComputedStyle(box);
      const text = document.createElement('canvas').getContext('2d');
      text.font = getComputedStyle(box, '::placeholder').font || `${style.fontSize} ${style.fontFamily}`;
      return [text.measureText(box.placeholder).width,
              box.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight)];
    }""")
    assert 0 < needs <= room, f"the placeholder needs {needs:.0f} px, the field has {room:.0f}"


def test_after_a_layout_is_chosen_with_the_keyboard_the_focus_stays_on_the_layout(page):
    """The audit: choosing a layout with the keyboard left the focus on the page body, so Tab started again
    from the top of the page."""
    dropdown = page.locator("#layout-preset input")
    dropdown.focus()
    page.keyboard.press("ArrowDown")
    page.keyboard.press("Enter")
    page.wait_for_timeout(500)  # the choice's events, and Gradio's blur
    assert page.evaluate("() => document.activeElement.closest('#layout-preset') !== null"), page.evaluate(
        "() => document.activeElement.tagName")
    page.keyboard.press("Escape")
    page.keyboard.press("Tab")
    after = page.evaluate("() => document.activeElement")
    assert after is not None and page.evaluate(
        "() => document.activeElement !== document.body && Boolean(document.querySelector('#layout-preset')"
        ".compareDocumentPosition(document.activeElement) & Node.DOCUMENT_POSITION_FOLLOWING)"), \
        "Tab after the layout did not go on to the next field"


def test_a_refusal_is_shown_once_next_to_its_field_and_goes_when_the_field_changes(page):
    page.locator("#prompt textarea").fill("A red kite over a grey sea.")
    steps_box(page).fill("2.5")  # a number field takes no letters; a fraction is still refused
    page.locator("#generate").click()
    line = page.locator("#error-sampling")
    line.get_by_text("steps: 2.5 is not a whole number").wait_for(timeout=30_000)
    assert "Fix: use a whole number" in line.inner_text()
    page.wait_for_timeout(1000)
    assert page.locator("body").inner_text().count("is not a whole number") == 1, "the refusal is shown twice"
    assert page.locator(".toast-body").count() == 0, "the refusal also came as a toast"
    steps_box(page).fill("")
    steps_box(page).press_sequentially("3")
    line.wait_for(state="detached", timeout=10_000)
    assert page.locator("body").inner_text().count("is not a whole number") == 0


def test_seed_minus_one_runs_with_a_drawn_seed_the_plot_names_its_series_and_history_finds_and_deletes_it(
        studio, page):
    IMAGES.mkdir(parents=True, exist_ok=True)
    page.locator("#prompt textarea").fill("A paper boat drifts down a gutter in the rain; thunder rolls far off.")
    steps_box(page).fill("3")
    page.locator("#layout-preset input").click()
    page.locator('#layout-preset li[aria-label^="sp1-cfg1:"]').click()  # the studio fixture preloads it
    page.locator("#new-seed input").check()
    page.wait_for_function("() => document.querySelector('#seed input').value === '-1'", timeout=10_000)
    page.locator("#generate").click()
    headline = page.locator("#run-headline")
    headline.get_by_text("drawn at random").wait_for(timeout=240_000)
    wait_settled(page, "run-headline")  # a pending event's timer ("0.3s") is part of the element's text
    name = headline.inner_text().split(" ")[0]
    drawn = int(headline.inner_text().split("seed ")[1].split(" ")[0])
    assert 0 <= drawn < 2**31

    legend = page.locator("#timing-plot .m2s-plot-legend").first.inner_text()
    assert "preview rank 0 (the only rank)" in legend and "preview steps 0-1 (excluded)" in legend
    ticks = page.locator("#timing-plot svg text[text-anchor=middle]").all_text_contents()
    assert [t for t in ticks if t.isdigit()] == ["0", "1", "2"], ticks
    tooltip = page.locator("#timing-plot circle title").first.text_content()
    assert re.fullmatch(r"preview rank 0 \(the only rank\), step 2: [\d,]+\.\d ms", tooltip), tooltip
    wait_settled(page, "timing-plot")
    page.locator("#timing-plot").screenshot(path=str(IMAGES / "studio-timing-plot.png"))

    if studio.outputs is not None:  # in-process studio: the run folder is readable here
        manifest = json.loads((studio.outputs / name / "manifest.json").read_text(encoding="utf-8"))
        assert manifest["request"]["seed"] == drawn and manifest["resolved"]["seed_asked"] == -1

    page.get_by_role("tab", name="History").click()
    page.locator("#history-gallery img").first.wait_for(state="visible", timeout=30_000)
    page.locator("#history-search textarea, #history-search input").first.fill(f"paper boat {drawn}")
    page.locator("#history-count").get_by_text("1 of").wait_for(timeout=30_000)
    page.locator("#history-gallery img").first.click()
    details = page.locator("#history-details")
    details.get_by_text(name).wait_for(timeout=30_000)
    assert "paper boat" in details.inner_text() and "drawn at random" in details.inner_text()
    caption = page.locator("#history-gallery .caption-label").first.inner_text()
    assert caption.startswith(f"seed {drawn} · 272p · sp1-cfg1"), caption
    wait_settled(page, "history-gallery")
    page.screenshot(path=str(IMAGES / "studio-history-search.png"), full_page=True)

    page.locator("#history-delete").click()
    page.locator("#history-confirm").get_by_text(f"Delete {name}").wait_for(timeout=10_000)
    page.locator("#history-delete-yes").click()
    page.locator("#history-count").get_by_text("0 of").wait_for(timeout=30_000)
    if studio.outputs is not None:
        assert not (studio.outputs / name).exists()
    # The audit: delete had no undo.
    page.locator("#history-undo-row").get_by_text(f"Deleted {name}").wait_for(timeout=10_000)
    page.locator("#history-undo").click()
    page.locator("#history-count").get_by_text("1 of").wait_for(timeout=30_000)
    page.locator("#history-undo-row").wait_for(state="hidden", timeout=10_000)
    if studio.outputs is not None:
        assert (studio.outputs / name / "manifest.json").is_file()
