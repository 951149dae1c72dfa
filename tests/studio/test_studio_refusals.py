"""Every /generate refusal in the project's words, uploads bounded, cancel by job id (own jobs only), a bounded
scratch folder."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from magi2studio.studio.context import MAX_UPLOAD_BYTES, StudioContext

from studio_support import everything_under, generate_args

PROJECT_WORDS = re.compile(r"^[a-z_]+(\[\d+\])?(\.[a-z_]+)*: .+\. Fix: .+$")


@pytest.mark.parametrize("overrides, field", [
    ({"seed": -2}, "seed"),  # -1 is "draw a random seed"
    ({"seed": "abc"}, "seed"),
    ({"seed": 2**70}, "seed"),
    ({"tier": "garbage"}, "tier"),
    ({"mode": "xyz"}, "mode"),
    ({"compile": "garbage"}, "compile"),
    ({"layout_preset": "garbage"}, "layout"),
    ({"deterministic": "maybe"}, "deterministic"),
    ({"video_cfg": "abc"}, "video_cfg"),
    ({"prompt": "", "prompt_file": "/etc/passwd"}, "prompt_file"),
    ({"mode": "i2va", "image": "/etc/passwd"}, "image"),
    ({"negative_prompt": "x" * 200_001}, "negative_prompt"),
    ({"layout_preset": "custom", "sp": "abc"}, "layout"),
])
def test_every_refusal_names_the_field_and_the_fix(studio, overrides, field):
    before = everything_under(studio.outputs)
    with pytest.raises(AppError) as caught:
        Client(studio.url, verbose=False).predict(**generate_args(**overrides), api_name="/generate")
    message = str(caught.value)
    assert PROJECT_WORDS.match(message) and message.startswith(f"{field}: "), message
    assert everything_under(studio.outputs) == before


def test_an_upload_over_the_limit_is_refused(studio, tmp_path):
    big = tmp_path / "big.png"
    with open(big, "wb") as file:
        file.truncate(MAX_UPLOAD_BYTES + 1)
    with pytest.raises(Exception, match=r"(?i)size|large|exceed"):
        Client(studio.url, verbose=False).predict(**generate_args(mode="i2va", image=handle_file(str(big))),
                                                  api_name="/generate")


def test_a_client_cancels_its_own_run_by_job_id_and_no_other(studio):
    client = Client(studio.url, verbose=False)
    job = client.submit(**generate_args(steps=200, seed=3), api_name="/generate")
    job_id = None
    deadline = time.monotonic() + 120
    while job_id is None and time.monotonic() < deadline:
        for output in job.outputs():
            found = re.search(r"job ([0-9a-f]{32})", str(output))
            if found:
                job_id = found.group(1)
        time.sleep(0.2)
    assert job_id, "the queued line names the job id"
    other = Client(studio.url, verbose=False)  # another session: the id alone moves nothing
    assert other.predict(job_id, api_name="/cancel_job").startswith("job_id: ")
    assert client.predict("0" * 32, api_name="/cancel_job").startswith("job_id: ")
    assert client.predict(job_id, api_name="/cancel_job").startswith("cancelling")
    with pytest.raises(AppError, match="cancel"):
        job.result(timeout=300)


def test_zips_are_capped_and_the_scratch_folder_goes_at_shutdown(studio, tmp_path, monkeypatch):
    monkeypatch.setattr(studio.ctx, "scratch_cap_bytes", 1)
    client = Client(studio.url, verbose=False)
    for seed in (21, 22):
        client.predict(**generate_args(seed=seed, steps=2), api_name="/generate")
    assert len(list(studio.ctx.scratch.glob("*.zip"))) == 1  # the newest stays, for its download button

    scratch = tmp_path / "scratch"
    (scratch / "upload-1" / "assets").mkdir(parents=True)
    (scratch / "run.zip").write_bytes(b"zip")
    StudioContext(engine=None, capabilities=None, slot=None, outputs_root=tmp_path, scratch=scratch).close()
    assert not scratch.exists()


def test_a_staged_reproduce_upload_is_removed_after_a_refusal(studio, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"prompt": "not an array"}')
    args = {"source_value": "Upload a set", "files": [handle_file(str(bad))], "tier_value": "272p",
            "layout_value": "sp1-cfg1", "seed_value": 42, "policy_value": "fixed", "steps_value": 2,
            "expect_value": "none", "expect_path": None, "skip_value": True}
    with pytest.raises(AppError, match="JSON arrays"):
        Client(studio.url, verbose=False).predict(*args.values(), api_name="/reproduce")
    assert not list(Path(studio.ctx.scratch).glob("upload-*"))
