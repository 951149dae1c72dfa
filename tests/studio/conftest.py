"""One studio on the embedded engine for the whole studio suite, launched on a free local port.

MAGI2STUDIO_URL=http://host:port/ points the browser test at a studio that runs elsewhere (the
built image: tests/distribution/test_image_build.py); only the browser test runs against it,
the others need the in-process context."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from studio_support import chromium_page, free_port

@dataclass
class Studio:
    url: str
    ctx: Any
    outputs: Path | None


@pytest.fixture(scope="session")
def studio(tmp_path_factory) -> Studio:
    if os.environ.get("MAGI2STUDIO_URL"):
        yield Studio(os.environ["MAGI2STUDIO_URL"], None, None)
        return
    from magi2studio.engines import get_engine
    from magi2studio.studio.app import create_app, launch_options

    engine = get_engine("embedded")
    outputs = tmp_path_factory.mktemp("studio-outputs")
    demo, ctx = create_app(engine, outputs, max_waiting=20, preload="sp1-cfg1")
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                **launch_options(ctx))
    try:
        yield Studio(f"http://127.0.0.1:{port}/", ctx, outputs)
    finally:
        ctx.slot.close()  # first, as the studio command does: followers get their last update
        demo.close()
        engine.close()
        ctx.close()


@pytest.fixture
def page():
    """A page of Debian's Chromium, headless, 1440x1000 (a test may resize it)."""
    with chromium_page(1440, 1000) as page:
        yield page
