"""The dev UI in a real browser (Debian's Chromium, driven by Playwright's sync API).

The server - ``create_app(ui=True)`` on Hypercorn, its runner, and the fake OpenAI server its
agent streams from - runs in a thread of its own with its own ``trio.run``; the tests are
plain functions that drive the page and ask that thread what the fake model server saw.
Nothing sleeps: every wait is on a page condition (Playwright's ``expect``) or on the fake
server's records.  A screenshot of each state goes to ``.artifacts/ui/``.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

import attrs
import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve
from hypercorn.typing import ASGIFramework
from playwright.sync_api import Browser, Page, Request, expect, sync_playwright
from starlette.applications import Starlette
from starlette.routing import Mount

import trio_agents as ta
from trio_agents.messages import ToolCall
from trio_agents.models import OpenAIChat
from trio_agents.server import create_app, serve
from trio_agents.testing import FakeServer, ResponsePlan, open_fake_openai_server, openai_stream

from ._server import ALICE, TOKENS

T = TypeVar("T")

SHOTS = Path(__file__).resolve().parent.parent / ".artifacts" / "ui"
WAIT_MS = 10_000  # the longest any page condition may take
expect.set_options(timeout=WAIT_MS)


# ==== the server, in its own thread ==============================================================


def _last_user_text(body: Any) -> str:
    texts = [m["content"] for m in body["messages"] if m["role"] == "user"]
    return str(texts[-1]) if texts else ""


def respond(body: Any) -> ResponsePlan:
    """What the fake model answers, by the user's last message.

    ``story``: 400 words, one every 50 ms (long enough to stop mid-answer).  ``weather``: a
    ``lookup`` call, then 40 words 40 ms apart (long enough to reload mid-answer).
    ``deploy X``: a ``deploy`` call (which needs approval), then the tool's result as text.
    """
    question = _last_user_text(body)
    after_tool = body["messages"][-1]["role"] == "tool"
    if "story" in question:
        return openai_stream([f"w{i} " for i in range(400)], delay=0.05)
    if "weather" in question:
        if after_tool:
            return openai_stream([f"w{i} " for i in range(40)], delay=0.04)
        call = ToolCall(id="call_lookup", name="lookup", arguments='{"city": "Paris"}')
        return openai_stream(tool_calls=[call])
    if question.startswith("deploy"):
        if after_tool:
            return openai_stream(f"Result: {body['messages'][-1]['content']}")
        service = question.split()[-1]
        call = ToolCall(id="call_deploy", name="deploy", arguments=json.dumps({"service": service}))
        return openai_stream(tool_calls=[call])
    return openai_stream(["Hello", " there!"], delay=0.02)


@attrs.define
class Served:
    """The servers the page talks to, and a way into their trio thread."""

    url: str  # approvals wait as long as it takes
    pausing_url: str  # approvals end the invocation `paused` after 0.2 s
    mounted_url: str  # the first app, mounted at /agents in another Starlette app
    dev_url: str  # insecure_dev: no tokens, the user a request names is believed
    fake: FakeServer
    deployed: list[str]
    token: trio.lowlevel.TrioToken

    def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Run ``fn()`` in the servers' trio thread, at most 10 s."""

        async def bounded() -> T:
            with trio.fail_after(10):
                return await fn()

        return trio.from_thread.run(bounded, trio_token=self.token)

    def requests_about(self, word: str) -> list[Any]:
        return trio.from_thread.run_sync(
            lambda: [r for r in self.fake.requests if word in _last_user_text(r.json)],
            trio_token=self.token,
        )


def make_agent(model: OpenAIChat, deployed: list[str]) -> ta.Agent:
    @ta.tool
    async def lookup(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    @ta.tool(requires_approval=True)
    async def deploy(service: str) -> str:
        """Deploy a service."""
        deployed.append(service)
        return f"{service} deployed"

    return ta.Agent(name="assistant", model=model, tools=[lookup, deploy])


async def _serve_all(
    ready: queue.Queue[Served | BaseException], stop: trio.Event, deployed: list[str]
) -> None:
    async with (
        open_fake_openai_server(responder=respond) as fake,
        OpenAIChat("fake-model", base_url=fake.base_url, api_key="test-key") as model,
        ta.Runner() as runner,
        ta.Runner(approval_timeout=0.2) as pausing,
        trio.open_nursery() as nursery,
    ):
        urls, apps = [], []
        for r in (runner, pausing):
            app = create_app([make_agent(model, deployed)], runner=r, tokens=TOKENS, ui=True)
            bound: list[str] = await nursery.start(
                partial(serve, app, host="127.0.0.1", port=0, shutdown_trigger=stop.wait)
            )
            urls.append(bound[0])
            apps.append(app)
        dev = create_app([make_agent(model, deployed)], runner=runner, insecure_dev=True, ui=True)
        dev_bound: list[str] = await nursery.start(
            partial(serve, dev, host="127.0.0.1", port=0, shutdown_trigger=stop.wait)
        )
        outer = Starlette(routes=[Mount("/agents", app=apps[0])])
        config = Config()
        config.bind = ["127.0.0.1:0"]
        config.accesslog = None
        bound = await nursery.start(
            partial(hypercorn_serve, cast(ASGIFramework, outer), config, shutdown_trigger=stop.wait)
        )
        ready.put(
            Served(
                url=urls[0],
                pausing_url=urls[1],
                mounted_url=bound[0] + "/agents",
                dev_url=dev_bound[0],
                fake=fake,
                deployed=deployed,
                token=trio.lowlevel.current_trio_token(),
            )
        )


def _thread_main(ready: queue.Queue[Served | BaseException], stop: list[trio.Event]) -> None:
    async def main() -> None:
        stop.append(trio.Event())
        await _serve_all(ready, stop[0], [])

    try:
        trio.run(main)
    except BaseException as exc:
        ready.put(exc)


@pytest.fixture(scope="module")
def served(chromium_path: str) -> Iterator[Served]:
    ready: queue.Queue[Served | BaseException] = queue.Queue()
    stop: list[trio.Event] = []
    thread = threading.Thread(target=_thread_main, args=(ready, stop), daemon=True)
    thread.start()
    got = ready.get(timeout=30)
    if isinstance(got, BaseException):
        raise got
    try:
        yield got
    finally:
        trio.from_thread.run_sync(stop[0].set, trio_token=got.token)
        thread.join(timeout=30)
        assert not thread.is_alive(), "the server thread did not stop"


@pytest.fixture(scope="module")
def browser(chromium_path: str) -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on(
        "console",
        lambda m: errors.append(m.text) if m.type == "warning" else None,
    )
    try:
        yield page
    finally:
        context.close()
    assert errors == [], f"the page raised or warned: {errors}"


# ==== helpers ====================================================================================


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"))


def connect(page: Page, url: str) -> None:
    """Open the page and sign in as alice (the token is kept in localStorage)."""
    page.goto(f"{url}/ui/")
    expect(page.locator("#mode")).to_have_text("not connected")
    page.fill("#user", "alice")
    page.fill("#token", ALICE)
    page.click("#auth button[type=submit]")
    expect(page.locator("#mode")).to_have_text("token")
    expect(page.locator("#app")).to_have_value("assistant")


def send(page: Page, text: str) -> None:
    page.fill("#message", text)
    page.press("#message", "Enter")


def row_ids(page: Page) -> list[str]:
    """The event id of every timeline row, in the order shown."""
    ids: list[str] = page.locator("#events .row").evaluate_all("rs => rs.map(r => r.dataset.id)")
    return ids


def assert_each_event_once(ids: list[str]) -> None:
    """No row twice, and the durable events (ids without a dot) are 1, 2, ... n: none lost."""
    assert len(set(ids)) == len(ids), ids
    durable = [int(i) for i in ids if "." not in i]
    assert durable == list(range(1, len(durable) + 1)), ids


def answer(page: Page) -> Any:
    return page.locator(".bubble.assistant .text").last


# ==== the tests ==================================================================================


def test_stop_mid_answer_closes_the_model_stream(served: Served, page: Page) -> None:
    """Stop while the answer streams: the fake model server saw the client go away, the
    page shows the cancelled outcome (reason, who) and the timeline has the cancel."""
    page.goto(f"{served.url}/ui/")
    expect(page.locator(".banner")).to_contain_text("needs a bearer token")
    shot(page, "00-needs-token")
    connect(page, served.url)
    shot(page, "01-empty")
    send(page, "tell me a long story")
    expect(page.locator(".bubble.user")).to_have_text("tell me a long story")
    expect(answer(page)).to_contain_text("w0 w1 w2 w3 w4 w5 ")
    expect(page.locator("#stop")).to_be_visible()
    [request] = served.requests_about("story")
    assert request.disconnected_at is None
    shot(page, "02-streaming")
    page.select_option("#stop-mode", "immediate")
    page.click("#stop")
    outcome = page.locator(".outcome")
    expect(outcome).to_have_attribute("data-status", "cancelled")
    expect(outcome).to_contain_text("stopped from the dev UI")
    expect(outcome).to_contain_text("stopped by alice")
    served.call(lambda: served.fake.wait_until(lambda: request.disconnected_at is not None))
    assert not request.completed
    kinds = page.locator("#events .row").evaluate_all("rs => rs.map(r => r.dataset.kind)")
    assert_each_event_once(row_ids(page))
    assert kinds[0] == "started"
    assert "cancel_requested" in kinds
    assert kinds[-1] == "ended"
    assert page.locator("#stop").is_hidden()
    expect(page.locator("#send")).to_be_visible()
    shot(page, "03-cancelled")


def test_approve_with_edited_arguments_and_deny(served: Served, page: Page) -> None:
    """An edit the tool refuses shows the server's 422 on the card; a valid edit is approved
    and the tool runs with it; a denied call never runs."""
    connect(page, served.url)
    send(page, "deploy api")
    card = page.locator(".approval").last
    expect(card.locator(".args-edit")).to_have_value('{\n  "service": "api"\n}')
    shot(page, "04-approval")
    card.locator(".args-edit").fill('{"services": "web"}')
    card.locator(".approve").click()
    expect(card.locator(".card-error")).to_contain_text("invalid_arguments")
    shot(page, "05-approval-refused")
    assert served.deployed == []
    card.locator(".args-edit").fill('{"service": "web"}')
    card.locator(".approve").click()
    expect(card).to_have_attribute("data-state", "approved")
    expect(page.locator(".outcome").last).to_have_attribute("data-status", "completed")
    expect(answer(page)).to_have_text("Result: web deployed")
    assert served.deployed == ["web"]
    page.locator(".tool").first.locator("summary").click()
    expect(page.locator(".tool").first.locator(".args")).to_contain_text('"service": "web"')
    shot(page, "06-approved")

    send(page, "deploy db")
    card = page.locator(".approval.open")
    expect(card.locator(".args-edit")).to_have_value('{\n  "service": "db"\n}')
    card.locator(".deny").click()
    expect(page.locator(".approval").last).to_have_attribute("data-state", "denied")
    expect(page.locator(".outcome").last).to_have_attribute("data-status", "completed")
    expect(page.locator('#events .row[data-kind="approval_decided"]')).to_contain_text("denied")
    assert served.deployed == ["web"]
    shot(page, "07-denied")
    # Reloaded: the earlier invocation comes back as the session's history.
    page.reload()
    expect(page.locator(".bubble.assistant .text").first).to_have_text("Result: web deployed")
    expect(page.locator(".approval")).to_have_attribute("data-state", "denied")
    shot(page, "07b-history")


def test_reload_mid_answer_shows_every_event_once(served: Served, page: Page) -> None:
    """Reload while the answer streams: the page draws what it had, follows on with
    Last-Event-ID, and the timeline ends with every seq exactly once."""
    connect(page, served.url)
    follows: list[Request] = []
    page.on("request", lambda r: follows.append(r) if r.url.endswith("/events") else None)
    send(page, "weather in Paris")
    expect(page.locator(".tool")).to_contain_text("lookup")
    expect(answer(page)).to_contain_text("w0 w1 w2 ")
    before = row_ids(page)
    page.reload()
    # Drawn again from what the page kept, then followed on from where it was.
    expect(page.locator(".bubble.user")).to_have_text("weather in Paris")
    expect(page.locator(".outcome")).to_have_attribute("data-status", "completed")
    expected = "".join(f"w{i} " for i in range(40))
    expect(answer(page)).to_have_text(expected)
    shot(page, "08-after-reload")
    [follow] = follows
    last_event_id = follow.headers.get("last-event-id", "")
    seq, _, sub = last_event_id.partition(".")
    assert int(seq) == max(int(i) for i in before)
    assert sub.isdigit()  # it was reloaded inside the streamed text
    after = row_ids(page)
    assert_each_event_once(after)
    assert after[: len(before)] == before
    kinds = page.locator("#events .row").evaluate_all("rs => rs.map(r => r.dataset.kind)")
    assert kinds.count("tool_call_finished") == 1
    assert kinds[-1] == "ended"
    assert page.locator(".bubble.assistant.streaming").count() == 0


def test_resume_a_paused_invocation(served: Served, page: Page) -> None:
    """An approval left waiting pauses the invocation; approving on the card records the
    decision, and Resume continues the same invocation to its answer."""
    connect(page, served.pausing_url)
    send(page, "deploy cache")
    outcome = page.locator(".outcome")
    expect(outcome).to_have_attribute("data-status", "paused")
    expect(outcome).to_contain_text("waiting for 1 approval")
    card = page.locator(".approval.open")
    expect(card.locator(".args-edit")).to_have_value('{\n  "service": "cache"\n}')
    shot(page, "09-paused")
    card.locator(".approve").click()
    expect(page.locator(".approval")).to_have_attribute("data-state", "approved")
    expect(page.locator(".approval")).to_contain_text("resume to continue")
    assert "cache" not in served.deployed
    page.locator(".outcome .resume").click()
    expect(page.locator(".outcome").last).to_have_attribute("data-status", "completed")
    expect(answer(page)).to_have_text("Result: cache deployed")
    assert served.deployed.count("cache") == 1
    expect(page.locator('#events .row[data-kind="started"]')).to_have_count(2)
    assert_each_event_once(row_ids(page))
    shot(page, "10-resumed")


def test_the_page_works_under_a_prefix(served: Served, page: Page) -> None:
    """Mounted at /agents in another app: the redirect lands on /agents/ui/ and the page's
    requests reach the API there."""
    page.goto(served.mounted_url + "/")
    expect(page).to_have_url(served.mounted_url + "/ui/")
    connect(page, served.mounted_url)
    send(page, "hello")
    expect(page.locator(".outcome")).to_have_attribute("data-status", "completed")
    expect(answer(page)).to_have_text("Hello there!")
    expect(page.locator(".session.active")).to_have_count(1)


def test_insecure_dev_needs_no_token(served: Served, page: Page) -> None:
    """Without tokens (``insecure_dev``) the page connects at once, as user ``dev``."""
    page.goto(f"{served.dev_url}/ui/")
    expect(page.locator("#mode")).to_have_text("insecure dev")
    send(page, "hello")
    expect(page.locator(".outcome")).to_have_attribute("data-status", "completed")
    expect(answer(page)).to_have_text("Hello there!")
    expect(page.locator(".session.active")).to_have_count(1)
    assert page.locator("#token").input_value() == ""
    shot(page, "11-insecure-dev")
