"""What a crowd of API clients costs the studio (issue 32; magi2studio/studio/door.py).

Counted, not timed: how often Gradio builds the config for a crowd's identical requests, and how many
outputs it rebuilds for a yield of /generate that names one. Those two were most of the studio's time
while 64 gradio_client clients arrived at once (py-spy; docs/performance.md), and a count shows the
cost on any machine where a timeout shows only on a loaded one.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import uuid

import gradio as gr
import httpx
import pytest
from gradio import route_utils
from gradio.state_holder import SessionState

from magi2studio.studio.app import launch_options


def _generate_fn(demo):
    return next(fn for fn in demo.fns.values() if fn.api_name == "generate")


def test_a_yield_of_generate_rebuilds_only_the_output_it_names(studio, monkeypatch):
    demo = studio.ctx.demo
    fn = _generate_fn(demo)
    progress = next(block for block in fn.outputs if getattr(block, "elem_id", None) == "progress")
    rebuilt = collections.Counter()
    update_config = SessionState._update_config

    def counting(self, key):
        rebuilt[key] += 1
        return update_config(self, key)

    monkeypatch.setattr(SessionState, "_update_config", counting)
    line = '<div class="m2s-progress"><span>waiting: position 3 in the queue (5 waiting)</span></div>'
    ours = asyncio.run(demo.postprocess_data(fn, {progress: line}, SessionState(demo)))
    assert not rebuilt, f"Gradio rebuilt {sum(rebuilt.values())} outputs the yield left alone"
    # The same answer as Gradio's own: the named output's value, every other one left as it is.
    theirs = asyncio.run(gr.Blocks.postprocess_data(demo, fn, {progress: line}, SessionState(demo)))
    assert len(fn.outputs) > 10 and ours == theirs
    assert ours[fn.outputs.index(progress)] == line


def test_a_crowd_asking_for_the_config_and_api_info_gets_them_built_once(studio, monkeypatch):
    built = []
    update_root = route_utils.update_root_in_config
    monkeypatch.setattr(route_utils, "update_root_in_config",
                        lambda config, root: built.append(root) or update_root(config, root))
    headers = {"x-crowd": uuid.uuid4().hex}  # a requester the studio has not answered yet

    def fetch(path: str) -> bytes:
        response = httpx.get(f"{studio.url}{path}", headers=headers, timeout=60)
        assert response.status_code == 200, (path, response.status_code)
        return response.content

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        configs = list(pool.map(fetch, ["config"] * 16))
        infos = list(pool.map(fetch, ["gradio_api/info"] * 16))
    assert len(built) == 1, f"Gradio built the config {len(built)} times for 16 identical requests"
    assert len(set(configs)) == 1 and len(set(infos)) == 1
    dependencies = httpx.Response(200, content=configs[0]).json()["dependencies"]
    assert any(dependency.get("api_name") == "generate" for dependency in dependencies)
    # Another requester (here another Host spelling) gets its own answer, with its own root URL.
    other = httpx.get(studio.url.replace("127.0.0.1", "localhost") + "config", timeout=60).json()
    assert other["root"].startswith("http://localhost:") and len(built) == 2


@pytest.mark.parametrize("auth", [("ana", "s3cret")])
def test_with_a_login_gradio_answers_every_config_request(studio, auth):
    assert launch_options(studio.ctx, auth=auth)["app_kwargs"]["middleware"] == []
    assert launch_options(studio.ctx)["app_kwargs"]["middleware"], "no door for a studio without a login"
