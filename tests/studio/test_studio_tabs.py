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
