"""Issue 29's audit, "Keyboard: Steps and EP are text boxes, not number fields": in Debian's Chromium, Steps
(Generate, A/B, Reproduce), the other optional whole numbers of Generate and the layout's EP are number fields the
arrow keys step; blank still means the default (Gradio's Number would show and send 0), and a bad value is one line
naming the field and the fix, next to the field."""

from __future__ import annotations

import re

import pytest

from studio_support import CHROMIUM, NO_CHROMIUM

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)]

# Generate's optional whole numbers (the request's), and the layout pickers' EP and A/B's and Reproduce's Steps.
GENERATE_FIELDS = ("steps", "refiner-steps", "preview-every", "output-width", "output-height", "layout-ep")


@pytest.fixture
def page(page, studio):
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(studio.url)
    page.locator("#layout-check").get_by_text("runs on").first.wait_for(timeout=60_000)
    return page


def number_input(page, elem_id: str):
    return page.locator(f"#{elem_id} input")


def no_toast(page) -> None:
    page.wait_for_timeout(1000)  # a toast would show by now
    toasts = page.locator("[data-testid=toast-body]").all_inner_texts()
    assert not toasts, toasts


def test_generates_whole_numbers_and_ep_are_number_fields_stepped_by_the_arrow_keys_blank_being_the_default(page):
    page.get_by_text("Advanced: guidance").click()  # the output size is in the accordion
    for elem_id in GENERATE_FIELDS:
        box = number_input(page, elem_id)
        assert box.get_attribute("type") == "number", f"#{elem_id} is not a number field"
        assert box.get_attribute("step") == "1", f"#{elem_id} does not step by 1"
    steps = number_input(page, "steps")
    assert steps.input_value() == "20"  # the embedded engine's demo steps
    for elem_id in ("refiner-steps", "preview-every", "output-width", "output-height", "layout-ep"):
        # Blank (the default, said by the placeholder), not Gradio's 0 for an empty Number.
        assert number_input(page, elem_id).input_value() == "", f"#{elem_id} does not start blank"
    assert "engine default" in (steps.get_attribute("placeholder") or "")
    assert number_input(page, "layout-ep").get_attribute("placeholder") == "= SP"
    steps.press("ArrowUp")
    assert steps.input_value() == "21"
    steps.press("ArrowDown")
    steps.press("ArrowDown")
    assert steps.input_value() == "19"


def test_a_bad_steps_value_is_one_line_next_to_the_field_and_blank_runs_the_engine_default(page):
    page.locator("#prompt textarea").fill("A red kite over a grey sea; gulls cry.")
    page.locator("#seed input").fill("9701")
    steps = number_input(page, "steps")
    steps.fill("1")
    steps.press("ArrowDown")  # 0: refused by the request's parser, in the CLI's words
    assert steps.input_value() == "0"
    page.locator("#generate").click()
    line = page.locator("#error-sampling")
    line.get_by_text(re.compile(r"^✗ steps: .+ Fix: use a whole number from 1 to \d+")).wait_for(timeout=30_000)
    assert line.locator(".m2s-refusal[role=alert]").count() == 1
    box, error = page.locator("#steps").bounding_box(), line.bounding_box()
    assert box["y"] + box["height"] <= error["y"] <= box["y"] + box["height"] + 120, "the refusal is not by Steps"
    no_toast(page)
    # Blank Steps: the engine's default (100 on the embedded engine), not 0.
    steps.fill("")
    line.wait_for(state="hidden", timeout=10_000)
    page.locator("#generate").click()
    page.locator("#progress").get_by_text(re.compile(r"preview: step \d+/100\b")).wait_for(timeout=300_000)
    assert page.locator("#error-sampling").is_hidden()
    page.locator("#cancel").click()
    page.locator("#progress").get_by_text(re.compile(r"cancelled")).wait_for(timeout=300_000)


def test_a_custom_ep_is_stepped_by_the_arrow_keys_and_a_bad_one_is_the_layouts_one_line(page):
    page.locator("#layout-preset input").click()
    page.get_by_role("option", name="custom SP / CFG / EP").click()
    ep = number_input(page, "layout-ep")
    page.wait_for_function("() => !document.querySelector('#layout-ep input').disabled", timeout=30_000)
    verdict = page.locator("#layout-check")
    ep.press("ArrowUp")  # blank (= SP) -> 1
    assert ep.input_value() == "1"
    verdict.get_by_text(re.compile(r"sp1-cfg1-ep1 runs on embedded|runs on embedded")).wait_for(timeout=30_000)
    ep.press("ArrowUp")  # 2 does not divide SP 1
    assert ep.input_value() == "2"
    verdict.get_by_text(re.compile(r"^✗ layout: .+ Fix: ")).wait_for(timeout=30_000)
    assert verdict.locator(".m2s-refusal[role=alert]").count() == 1
    ep.fill("")  # blank again: EP = SP
    verdict.get_by_text("runs on embedded").wait_for(timeout=30_000)
    no_toast(page)


@pytest.mark.parametrize("tab, elem_id", [("A/B", "ab-steps"), ("Reproduce", "reproduce-steps")])
def test_ab_and_reproduce_steps_are_number_fields_starting_blank(page, tab, elem_id):
    page.get_by_role("tab", name=tab).click()
    steps = number_input(page, elem_id)
    steps.wait_for(timeout=30_000)
    assert steps.get_attribute("type") == "number" and steps.input_value() == ""
    steps.press("ArrowUp")
    assert steps.input_value() == "1"


def test_a_bad_ab_steps_value_is_one_line_under_the_request(page):
    page.get_by_role("tab", name="A/B").click()
    page.locator("#ab-prompt textarea").fill("A kite over a grey sea")
    steps = number_input(page, "ab-steps")
    steps.fill("-3")
    page.locator("#ab-start").click()
    line = page.locator("#error-ab-request")
    line.get_by_text(re.compile(r"steps: .+ Fix: use a whole number from 1 to \d+")).wait_for(timeout=60_000)
    assert line.locator(".m2s-refusal[role=alert]").count() == 1
    no_toast(page)
    steps.fill("4")
    line.wait_for(state="hidden", timeout=10_000)
