"""The studio's tab strip: every child of gr.Tabs is a Tab, so Gradio never relabels tabs when one is selected."""

from __future__ import annotations

import warnings

import gradio as gr

from magi2studio.engines import get_engine
from magi2studio.studio.app import TABS, create_app


def test_tabs_hold_only_tabs_and_each_tab_once(tmp_path):
    engine = get_engine("embedded")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            demo, ctx = create_app(engine, tmp_path / "outputs")
        try:
            tab_warnings = [str(w.message) for w in caught if "gr.Tabs()" in str(w.message)]
            assert tab_warnings == [], tab_warnings
            children = ctx.tabs.children
            assert all(isinstance(child, gr.Tab) for child in children), [type(c).__name__ for c in children]
            assert [child.id for child in children] == list(TABS)
        finally:
            ctx.slot.close()
            demo.close()
    finally:
        engine.close()


def _descendants(block):
    for child in getattr(block, "children", []):
        yield child
        yield from _descendants(child)


def test_generate_ab_and_reproduce_share_one_layout_control(tmp_path):
    """Issue 29 (j): A/B and Reproduce took the layout as free text (default sp1-cfg1) beside Generate's dropdown.
    Generate and Reproduce have one Layout control; A/B one per side (the audit's A/B item), the candidate's
    offering "same as the control" first and starting there."""
    engine = get_engine("embedded")
    try:
        demo, ctx = create_app(engine, tmp_path / "outputs")
        try:
            controls = {}
            for tab in ctx.tabs.children:
                layouts = [c for c in _descendants(tab) if getattr(c, "label", None) == "Layout"]
                if tab.id in ("generate", "reproduce"):
                    assert len(layouts) == 1, (tab.id, [type(c).__name__ for c in layouts])
                    controls[tab.id] = layouts[0]
                elif tab.id == "ab":
                    assert [c.elem_id for c in layouts] == ["ab-control-layout-preset", "ab-candidate-layout-preset"]
                    controls["ab"], controls["ab-candidate"] = layouts
            kinds = {tab: type(control).__name__ for tab, control in controls.items()}
            assert set(kinds.values()) == {"Dropdown"} and len(kinds) == 4, kinds
            generate = controls["generate"]
            for tab in ("ab", "reproduce"):
                assert controls[tab].choices == generate.choices, tab
                assert controls[tab].value == generate.value, (tab, controls[tab].value, generate.value)
            assert controls["reproduce"].elem_id == "reproduce-layout-preset"
            candidate = controls["ab-candidate"]
            assert candidate.choices == [("same as the control", "same"), *generate.choices]
            assert candidate.value == "same"
        finally:
            ctx.slot.close()
            demo.close()
    finally:
        engine.close()
