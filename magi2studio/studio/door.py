"""What a crowd of API clients costs the studio (issue 32): answers made once, outputs left alone.

``gradio_client.Client(url)`` fetches ``/config`` and ``/gradio_api/info`` with httpx's default 5 s
read timeout. Gradio rebuilds both for every request: ``/config`` deep-copies this app's 190 KB
config and walks it to rewrite file URLs, ``/gradio_api/info`` encodes its cached dict again with
FastAPI's ``jsonable_encoder`` on the event loop. Measured with py-spy on the studio while 64
clients arrived at once on a loaded 2-core machine, those two took most of the studio's CPU, and
36 to 56 of the 64 clients ended in ``ReadTimeout`` before their ``/generate`` call was made.

:class:`RepeatedAnswers` keeps each one's first 200 answer, per exact request (its path, query and
every header, so the root URL Gradio writes into it is the requester's), and replays it; one
request per key builds it while the others wait. The bytes are Gradio's own, so a replay is what
Gradio would have answered: the app's config and API info do not change after launch (a new config
object, as Gradio makes only while launching, is a new key). Only for a studio without a login: with
``--auth`` the answers depend on a session that can end, so every request goes to Gradio as before.

:class:`UnchangedOutputsBlocks`: an event that yields a dict of updates names the outputs it changes;
Gradio answers each other output as ``gr.skip()`` but first builds a new component and its config for
it, on the event loop, at every yield. /generate has 20 outputs and yields to every client on taking
its job, then every 2 s while it waits; in the same profile that took the event loop longer than
the config itself. The untouched outputs get Gradio's answer to ``gr.skip()`` without the rebuild.
"""

from __future__ import annotations

import asyncio
import copy
from collections import OrderedDict
from typing import Any

import gradio as gr
from gradio.blocks import Block, postprocess_update_dict

# The routes gradio_client reads while it sets up, relative to the app's root path.
ROUTES = ("/config", "/gradio_api/info")
# Distinct requesters (header sets) remembered; each entry is one config (about 200 KB) or API info.
MAX_ENTRIES = 32

Message = dict[str, Any]


class RepeatedAnswers:
    """ASGI middleware: ``GET`` of :data:`ROUTES` answered from the first 200 answer to the same request."""

    def __init__(self, app: Any, blocks: Any) -> None:
        self.app = app
        self.blocks = blocks
        self._answers: OrderedDict[tuple, list[Message]] = OrderedDict()
        self._building: dict[tuple, asyncio.Lock] = {}

    def _key(self, scope: dict[str, Any]) -> tuple | None:
        if scope["type"] != "http" or scope["method"] != "GET":
            return None
        path, root = scope["path"], scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]
        if path.rstrip("/") not in ROUTES:
            return None
        return (id(self.blocks.config), scope.get("scheme"), root, path, scope.get("query_string", b""),
                tuple(sorted(scope.get("headers", ()))))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        key = self._key(scope)
        if key is None:
            await self.app(scope, receive, send)
            return
        async with self._building.setdefault(key, asyncio.Lock()):
            answer = self._answers.get(key)
            if answer is None:
                answer = await self._ask_gradio(scope, receive, send)
                if answer is None:
                    self._building.pop(key, None)
                    return
                self._answers[key] = answer
                while len(self._answers) > MAX_ENTRIES:
                    self._building.pop(self._answers.popitem(last=False)[0], None)
                return
            self._answers.move_to_end(key)
        for message in answer:
            await send(message)

    async def _ask_gradio(self, scope: dict[str, Any], receive: Any, send: Any) -> list[Message] | None:
        """Pass the request on and send Gradio's answer; return it when it can be repeated (a whole 200, no cookie)."""
        messages: list[Message] = []

        async def keep(message: Message) -> None:
            messages.append(message)
            await send(message)

        await self.app(scope, receive, keep)
        start = messages[0] if messages else {}
        repeatable = (start.get("type") == "http.response.start" and start.get("status") == 200
                      and not any(name.lower() == b"set-cookie" for name, _ in start.get("headers", ()))
                      and not messages[-1].get("more_body", False))
        return messages if repeatable else None


class UnchangedOutputsBlocks(gr.Blocks):
    """``gr.Blocks`` that post-processes only the outputs a dict of updates names; for each other one it sends
    Gradio's own answer to ``gr.skip()`` (``postprocess_update_dict`` of an empty update), made without the rebuild."""

    async def postprocess_data(self, block_fn: Any, predictions: Any, state: Any) -> list[Any]:
        outputs = list(block_fn.outputs)
        if (not isinstance(predictions, dict) or not predictions or block_fn.batch
                or not all(isinstance(key, Block) for key in predictions)):
            return await super().postprocess_data(block_fn, predictions, state)
        values = {key._id: value for key, value in predictions.items()}
        if not any(block._id in values for block in outputs):
            return await super().postprocess_data(block_fn, predictions, state)
        # A State output left alone is cheap for Gradio (no rebuild); it keeps answering those itself.
        named = [index for index, block in enumerate(outputs) if block._id in values or block.stateful]
        if len(named) == len(outputs):
            return await super().postprocess_data(block_fn, predictions, state)
        narrowed = copy.copy(block_fn)
        narrowed.outputs = [outputs[index] for index in named]
        listed = [values.get(block._id, gr.skip()) for block in narrowed.outputs]
        # One output: Gradio takes the bare value (it wraps it in a list itself).
        done = await super().postprocess_data(narrowed, listed if len(listed) > 1 else listed[0], state)
        answer = [postprocess_update_dict(block, {"__type__": "update"}, block_fn.postprocess) for block in outputs]
        for index, value in zip(named, done):
            answer[index] = value
        return answer
