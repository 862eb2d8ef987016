"""The official A2A client (``a2a-sdk``, asyncio) in a process of its own, driven by
``tests/test_a2a_sdk.py``.

``python -m tests.a2a_client_child SCENARIO '{"url": ..., "token": ..., ...}'`` runs one
scenario and prints one JSON line per step (``{"step": ..., ...}``) as it happens, so the
test can look at what the servers saw at that moment.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncGenerator
from typing import Any, cast

import httpx
from a2a.client import ClientConfig, ClientFactory
from a2a.client.client import Client
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
)
from google.protobuf.json_format import MessageToDict


def say(step: str, **data: Any) -> None:
    print(json.dumps({"step": step, **data}), flush=True)


OPENED: list[httpx.AsyncClient] = []  # closed when the scenario ends


async def open_client(url: str, token: str, *, streaming: bool = True) -> Client:
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
    OPENED.append(http)
    factory = ClientFactory(ClientConfig(httpx_client=http, streaming=streaming))
    return await factory.create_from_url(url)


async def run(scenario: str, args: dict[str, Any]) -> None:
    try:
        await SCENARIOS[scenario](args)
    finally:
        for http in OPENED:
            await http.aclose()


def request(text: str) -> SendMessageRequest:
    return SendMessageRequest(
        message=Message(message_id="m1", role=Role.ROLE_USER, parts=[Part(text=text)])
    )


def kind(update: StreamResponse) -> str:
    return str(update.WhichOneof("payload"))


def as_json(update: Any) -> Any:
    return MessageToDict(update)


async def send(args: dict[str, Any]) -> None:
    """SendMessage (no streaming), GetTask, ListTasks; then the errors another user and an
    unknown id get."""
    client = await open_client(args["url"], args["token"], streaming=False)
    [answer] = [u async for u in client.send_message(request(args["text"]))]
    task = answer.task
    say("sent", task=as_json(task))
    got = await client.get_task(GetTaskRequest(id=task.id))
    listed = await client.list_tasks(ListTasksRequest(context_id=task.context_id))
    say("read", task=as_json(got), listed=[t.id for t in listed.tasks])
    errors = {}
    other = await open_client(args["url"], args["other_token"], streaming=False)
    for name, client_, task_id in [
        ("unknown", client, "0123456789abcdef0123456789abcdef"),
        ("another_users", other, task.id),
    ]:
        try:
            await client_.get_task(GetTaskRequest(id=task_id))
        except Exception as exc:
            errors[name] = [type(exc).__name__, str(exc)]
    say("errors", errors=errors)


async def stream_cancel(args: dict[str, Any]) -> None:
    """Stream a task; after a few deltas say so, and once told (a line on stdin) cancel it
    through ``cancel_url``; say when the answer came; then read the rest of the stream."""
    client = await open_client(args["url"], args["token"])
    canceller = await open_client(args["cancel_url"], args["token"])
    updates = cast(AsyncGenerator[StreamResponse, None], client.send_message(request(args["text"])))
    task_id = ""
    seen = 0
    async for update in updates:
        if update.HasField("task"):
            task_id = update.task.id
            say("task", state=update.task.status.state)
        if update.HasField("artifact_update"):
            seen += 1
            if seen == 3:
                say("streaming", task_id=task_id)
                await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
                cancelled = await canceller.cancel_task(CancelTaskRequest(id=task_id))
                say("cancelled", task=as_json(cancelled))
                break
    rest = [kind(u) for u in [u async for u in updates]]
    await updates.aclose()
    say("stream_end", rest=rest)


async def resubscribe(args: dict[str, Any]) -> None:
    """Stream a task from ``url``; close the stream after a few deltas (not a cancel);
    subscribe at ``other_url`` and follow to the end; GetTask there."""
    client = await open_client(args["url"], args["token"])
    updates = cast(AsyncGenerator[StreamResponse, None], client.send_message(request(args["text"])))
    task_id = ""
    pieces: list[str] = []
    async for update in updates:
        if update.HasField("task"):
            task_id = update.task.id
        if update.HasField("artifact_update") and update.artifact_update.artifact.artifact_id == (
            "text"
        ):
            pieces += [p.text for p in update.artifact_update.artifact.parts]
            if len(pieces) == 3:
                break
    await updates.aclose()  # the HTTP stream closes here
    say("closed", task_id=task_id, text="".join(pieces))
    other = await open_client(args["other_url"], args["token"])
    following = other.subscribe(SubscribeToTaskRequest(id=task_id))
    first: Any = None
    text: list[str] = []
    final = None
    async for update in following:
        if first is None:
            first = as_json(update)
            # What the store holds so far (the running instance writes deltas in batches).
            text = [a.parts[0].text for a in update.task.artifacts if a.artifact_id == "text"]
        elif update.HasField("artifact_update"):
            artifact = update.artifact_update.artifact
            if artifact.artifact_id == "text":
                text += [p.text for p in artifact.parts]
        elif update.HasField("status_update"):
            final = update.status_update.status.state
    got = await other.get_task(GetTaskRequest(id=task_id))
    say("followed", first=first, text="".join(text), final=final, task=as_json(got))


SCENARIOS = {"send": send, "stream_cancel": stream_cancel, "resubscribe": resubscribe}


def main() -> None:
    scenario, raw = sys.argv[1], sys.argv[2]
    try:
        asyncio.run(run(scenario, json.loads(raw)))
    except Exception as exc:
        say("failed", error=f"{type(exc).__name__}: {exc}")
        raise


if __name__ == "__main__":
    main()
