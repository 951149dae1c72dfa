"""The studio's Reproduce and A/B views, through their endpoints, on the embedded engine."""

from __future__ import annotations

import json
import socket

import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from magi2studio.run_folder.runs import is_complete, run_id_of
from magi2studio.reproduction.samples import BUNDLED_DIR
from magi2studio.studio.tab_reproduce import BUNDLED_CHOICE, UPLOAD_CHOICE

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    from magi2studio.engines import get_engine
    from magi2studio.studio.app import create_app, launch_options

    engine = get_engine("embedded")
    outputs = tmp_path_factory.mktemp("studio-outputs")
    demo, ctx = create_app(engine, outputs, max_waiting=8)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                **launch_options(ctx))
    try:
        yield Client(f"http://127.0.0.1:{port}/", verbose=False), outputs
    finally:
        demo.close()
        ctx.slot.close()
        engine.close()


def reproduce_args(source, files=None, **overrides):
    args = {"source_value": source, "files": files, "tier_value": "272p", "layout_value": "sp1-cfg1",
            "seed_value": 42, "policy_value": "fixed", "steps_value": 3, "expect_value": "none",
            "expect_path": None, "skip_value": True}
    args.update(overrides)
    return list(args.values())


def test_an_uploaded_set_runs_through_the_slot_then_resumes(studio, tmp_path):
    client, outputs = studio
    set_file = tmp_path / "one.json"
    set_file.write_text(json.dumps([{"prompt_file": "sample_001.txt", "name": "clay"}]))
    files = [handle_file(str(set_file)), handle_file(str(BUNDLED_DIR / "assets" / "sample_001.txt"))]
    status, table, posters, notes = client.predict(*reproduce_args(UPLOAD_CHOICE, files), api_name="/reproduce")
    assert status.startswith("**done**") and "ran 1" in status
    assert table["data"][0][:3] == ["clay", "ran", "t2va"]
    assert len(posters) == 1 and "embedded engine" in notes
    run_folders = [p for p in outputs.iterdir() if is_complete(p) and p.name.endswith("-t2va-272p-s42-" + run_id_of(p))]
    assert len(run_folders) == 1  # the run went to the studio's outputs like any other run
    status, table, _, _ = client.predict(*reproduce_args(UPLOAD_CHOICE, files), api_name="/reproduce")
    assert table["data"][0][1] == "resumed" and "resumed 1" in status


def test_a_bad_upload_is_refused_before_any_run(studio, tmp_path):
    client, _ = studio
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"prompt": "not an array"}))
    with pytest.raises(AppError, match="JSON arrays"):
        client.predict(*reproduce_args(UPLOAD_CHOICE, [handle_file(str(bad))]), api_name="/reproduce")
    with pytest.raises(AppError, match="layout: sp8-cfg1-ep4 needs 8 ranks"):
        client.predict(*reproduce_args(BUNDLED_CHOICE, layout_value="sp8-cfg1-ep4"), api_name="/reproduce")
    with pytest.raises(AppError, match=r"samples\[4\].prompt_file"):
        client.predict(*reproduce_args(BUNDLED_CHOICE, skip_value=False), api_name="/reproduce")


def test_the_ab_view_refuses_zero_pairs(studio):
    client, _ = studio
    with pytest.raises(AppError, match="pairs"):
        client.predict("a kite", "272p", 42, 3, 0, "", "", "sp1-cfg1", api_name="/ab")


def test_ab_and_reproduce_refuse_a_bad_layout_as_generate_does(studio):
    """Issue 29 (j): one layout check on every tab; a bad custom layout is one ``layout: ... Fix:`` line."""
    client, _ = studio
    custom_cfg3 = ("custom", 2, 3, "")
    with pytest.raises(AppError, match=r"^layout: cfg3: MAGI-2 has exactly two CFG branches\. Fix: use cfg1 or cfg2"):
        client.predict("a kite", "272p", 42, 3, 2, "", "", *custom_cfg3, api_name="/ab")
    with pytest.raises(AppError, match=r"^layout: a custom layout needs SP and CFG\. Fix: "):
        client.predict("a kite", "272p", 42, 3, 2, "", "", "custom", None, None, "", api_name="/ab")
    args = reproduce_args(BUNDLED_CHOICE) + list(custom_cfg3[1:])
    args[3] = "custom"
    with pytest.raises(AppError, match=r"^layout: cfg3: MAGI-2 has exactly two CFG branches\. Fix: use cfg1 or cfg2"):
        client.predict(*args, api_name="/reproduce")
