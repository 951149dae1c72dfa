"""An optional whole number on the page: an ``<input type="number">`` (arrow keys step it), blank meaning a default.

Gradio 6.31's Number shows and sends 0 for a first value of ``None`` (its frontend sets ``value ??= 0``), which
would turn "blank: the default" into a refused 0. An empty string is not null: the field starts blank with its
placeholder, and sends ``""`` until something is typed (``None`` once cleared). Both read as blank in
``form.layout_from_form``, ``form.plan_from_form`` and the A/B and Reproduce handlers. No ``minimum`` or
``precision``: Gradio would refuse or round in its own words (a red toast, a silent 2); 0, -1 or 2.5 reach the
request's parser, which refuses them in one line naming the field, as the CLI does.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

BLANK = ""


def optional_whole_number(value: int | str | None = None, **options: Any) -> gr.Number:
    """A number field stepped by 1 whose blank (``None`` or :data:`BLANK`) shows the placeholder, not 0."""
    return gr.Number(value=BLANK if value is None else value, step=1, **options)
