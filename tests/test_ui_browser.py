"""The dev UI in a real browser (Debian's Chromium, driven by Playwright's sync API).

The server - ``create_app(ui=True)`` on Hypercorn, its runner, and the fake OpenAI server its
agent streams from - runs in a thread of its own with its own ``trio.run``; the tests are
plain functions that drive the page and ask that thread what the fake model server saw.
The tests of a server that goes away run the real ``trio-agents serve`` (on a SQLite file) in
a process of their own, SIGKILL it and start it again on the same port, with the same fake
model server.  Nothing sleeps: every wait is on a page condition (Playwright's ``expect``),
on the fake server's records, or on a server's answer.  A screenshot of each state goes to
``.artifacts/ui/``.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import attrs
import httpx2
import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve
from hypercorn.typing import ASGIFramework
from playwright.sync_api import Browser, Page, Request, Route, expect, sync_playwright
from starlette.applications import Starlette
from starlette.routing import Mount

import trio_agents as ta
from trio_agents.messages import ToolCall
from trio_agents.models import OpenAIChat
from trio_agents.server import create_app, serve
from trio_agents.testing import FakeServer, ResponsePlan, open_fake_openai_server, openai_stream

from ._helpers import served_in_thread
from ._server import ALICE, TOKENS, auth

T = TypeVar("T")

SHOTS = Path(__file__).resolve().parent.parent / ".artifacts" / "ui"
WAIT_MS = 10_000  # the longest any page condition may take
expect.set_options(timeout=WAIT_MS)


# ==== the server, in its own thread ==============================================================


def _last_user_text(body: Any) -> str:
    texts = [m["content"] for m in body["messages"] if m["role"] == "user"]
    return str(texts[-1]) if texts else ""


RECOVER_REQUESTS: Counter[str] = Counter()
TAKEN_OVER_ANSWER = [f"r{i} " for i in range(20)]


def respond(body: Any) -> ResponsePlan:
    """What the fake model answers, by the user's last message.

    ``story``: 400 words, one every 50 ms (long enough to stop mid-answer).  ``weather``: a
    ``lookup`` call, then 40 words 40 ms apart (long enough to reload mid-answer).
    ``deploy X``: a ``deploy`` call (which needs approval), then the tool's result as text.
    ``recover N ...``: N words, 50 ms apart, the first time; ``r0 ... r19`` after that.
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
    if question.startswith("recover"):
        # "recover N ...": the first request streams N words, 50 ms apart (long enough to cut
        # the connection mid-answer); a later one - the run that took over - answers at once.
        RECOVER_REQUESTS[question] += 1
        if RECOVER_REQUESTS[question] == 1:
            words = int(question.split()[1].rstrip(":"))
            return openai_stream([f"w{i} " for i in range(words)], delay=0.05)
        return openai_stream(TAKEN_OVER_ANSWER, delay=0.01)
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


@pytest.fixture(scope="module")
def served(chromium_path: str) -> Iterator[Served]:
    got: Served
    with served_in_thread(partial(_serve_all, deployed=[])) as got:
        yield got


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


def connect(page: Page, url: str, app: str = "assistant") -> None:
    """Open the page and sign in as alice (the token is kept in localStorage)."""
    page.goto(f"{url}/ui/")
    expect(page.locator("#mode")).to_have_text("not connected")
    page.fill("#user", "alice")
    page.fill("#token", ALICE)
    page.click("#auth button[type=submit]")
    expect(page.locator("#mode")).to_have_text("token")
    expect(page.locator("#app")).to_have_value(app)


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
    # Reloaded: both invocations come back from the store as they were drawn live.
    page.reload()
    expect(
        page.locator(".bubble.assistant .text").filter(has_text="Result: web deployed")
    ).to_have_count(1)
    expect(page.locator(".approval").first).to_have_attribute("data-state", "approved")
    expect(page.locator(".approval").last).to_have_attribute("data-state", "denied")
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


# ==== the server goes away =======================================================================

ROOT = Path(__file__).resolve().parent.parent
LEASE_TTL = 2  # seconds: how soon the restarted server takes over the dead one's run


@attrs.define
class ServeProcess:
    """``trio-agents serve`` in a process of its own (``tests.server_agents:agent``, "talker")."""

    url: str
    process: subprocess.Popen[bytes]

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)


@contextmanager
def serve_process(store: str, model_url: str, port: int = 0) -> Iterator[ServeProcess]:
    """Start the real command on ``store`` and ``port`` (0: a free one); yield once it said
    where it serves.  Leaving kills it if the test did not."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TRIO_AGENTS_TOKENS": ",".join(f"{t}={u}" for t, u in TOKENS.items()),
        "TRIO_AGENTS_TEST_MODEL_URL": model_url,
    }
    argv = [sys.executable, "-m", "trio_agents.cli", "serve", "tests.server_agents:agent"]
    argv += ["--store", store, "--port", str(port), "--lease-ttl", str(LEASE_TTL)]
    process = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    lines: queue.Queue[bytes] = queue.Queue()

    def drain() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put(b"")

    threading.Thread(target=drain, daemon=True).start()
    try:
        said = b""
        while (found := re.search(rb"serving talker at (http://\S+)", said)) is None:
            line = lines.get(timeout=30)
            assert line, f"the server exited before serving: {said!r}"
            said += line
        yield ServeProcess(url=found.group(1).decode(), process=process)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        assert process.stdout is not None
        process.stdout.close()


# When the page asks for /events, in seconds on its own clock (Playwright's request events
# reach the test late, and without times for requests that failed).
TIME_EVENTS_FETCHES = """
window.eventsFetched = [];
window.addEventListener("online", () => { window.onlineAt = performance.now() / 1000; });
const realFetch = window.fetch;
window.fetch = (url, ...rest) => {
  if (String(url).endsWith("/events")) window.eventsFetched.push(performance.now() / 1000);
  return realFetch(url, ...rest);
};
"""


def visible_text(page: Page) -> str:
    return page.locator("body").inner_text()


def assert_no_raw_error(page: Page) -> None:
    text = visible_text(page)
    for raw in ("TypeError", "Failed to fetch", "network error"):
        assert raw not in text, text


def last_event_id(page: Page) -> str:
    """The id of the last event the page has seen (its snapshot in sessionStorage)."""
    seen: str = page.evaluate("JSON.parse(sessionStorage.getItem('ta.current')).lastId")
    return seen


def test_the_page_rides_out_a_server_killed_and_restarted(
    served: Served, page: Page, tmp_path: Path
) -> None:
    """SIGKILL ``trio-agents serve`` (SQLite) mid-answer: the page says the connection is lost
    and counts down to its next attempt (no raw JavaScript error), Stop waits, and its attempts
    back off.  Restarted on the same port and store, the server takes the run over once the
    dead lease lapses; the page reattaches from the last event it saw and shows the run going
    on ("taken over from ... by ...") to its ending: every event once, the answer once."""
    store = f"sqlite:///{tmp_path / 'agents.db'}"
    follows: list[Request] = []
    page.on("request", lambda r: follows.append(r) if r.url.endswith("/events") else None)
    page.add_init_script(TIME_EVENTS_FETCHES)
    with serve_process(store, served.fake.base_url) as first:
        connect(page, first.url, app="talker")
        send(page, "recover 300: talk on")
        expect(answer(page)).to_contain_text("w0 w1 w2 w3 ")
        first.kill()
        bar = page.locator("#link")
        expect(bar).to_contain_text("Connection lost. The server cannot be reached.")
        expect(bar).to_contain_text(re.compile(r"Reconnecting in \d+ s \(attempt \d+\)"))
        expect(page.locator("#stop")).to_be_disabled()
        expect(page.locator("#chat-status")).to_have_class(re.compile(r"\bstale\b"))
        expect(page.locator("#mode")).to_have_text("reconnecting")
        expect(bar).to_contain_text(re.compile(r"\(attempt [4-9]\)"))  # three attempts failed
        assert_no_raw_error(page)
        shot(page, "12-connection-lost")
        seen = last_event_id(page)
        assert "." in seen  # inside the streamed text
    with serve_process(store, served.fake.base_url, port=urlsplit(first.url).port or 0):
        rounds: list[float] = page.evaluate("window.eventsFetched")
        # Retry now (if the page is still waiting for its next round: no need to wait here).
        page.evaluate("document.querySelector('#link button')?.click()")
        expect(page.locator(".divider.labelled")).to_contain_text(
            re.compile(r"taken over from \S+ by \S+")
        )
        expect(page.locator(".outcome")).to_have_attribute("data-status", "completed")
        expect(bar).to_be_hidden()
        expect(page.locator("#mode")).to_have_text("token")
        expect(answer(page)).to_have_text("".join(TAKEN_OVER_ANSWER))
        shot(page, "13-taken-over")
    assert page.locator("#messages").inner_text().count("r0 r1 r2") == 1
    assert_no_raw_error(page)
    assert page.locator(".bubble.interrupted").count() == 1  # the dead process's answer
    assert_each_event_once(row_ids(page))
    kinds = page.locator("#events .row").evaluate_all("rs => rs.map(r => r.dataset.kind)")
    assert kinds.count("started") == 2
    assert kinds[-1] == "ended"
    # Every attempt after the kill reattached from the last event seen: at once, then in
    # rounds 0.5 s doubling apart, each drawn in [half, all] of that: [0.25, 0.5], [0.5, 1], ...
    assert {r.headers.get("last-event-id") for r in follows} == {seen}, seen
    gaps = [b - a for a, b in itertools.pairwise(rounds)]
    assert len(gaps) >= 2, gaps
    for k, gap in enumerate(gaps):
        assert 0.25 * 2**k - 0.05 <= gap <= 0.5 * 2**k + 0.3, gaps


def follow_to_end(url: str, invocation_id: str) -> str:
    """Follow an invocation's events from the start until its terminal frame; the SSE body."""
    with (
        httpx2.Client(base_url=url, headers=auth(ALICE), timeout=30) as http,
        http.stream("GET", f"/invocations/{invocation_id}/events") as followed,
    ):
        return "".join(followed.iter_text())


def current_id(page: Page) -> str:
    shown: str = page.evaluate("JSON.parse(sessionStorage.getItem('ta.current')).id")
    return shown


def test_a_run_that_ends_while_the_page_is_away(served: Served, page: Page, tmp_path: Path) -> None:
    """The server is SIGKILLed mid-answer and the browser then goes offline; the restarted
    server takes the run over and it ends while the page cannot see it.  Back online, the
    page tries again at once (not at its next round), reattaches from the last event it saw,
    and shows the rest of the run and its ending: every event once, the answer once."""
    store = f"sqlite:///{tmp_path / 'agents.db'}"
    page.add_init_script(TIME_EVENTS_FETCHES)
    with serve_process(store, served.fake.base_url) as first:
        connect(page, first.url, app="talker")
        send(page, "recover 300: then go away")
        expect(answer(page)).to_contain_text("w0 w1 w2 ")
        first.kill()
        expect(page.locator("#link")).to_contain_text("Connection lost")
        page.context.set_offline(True)
    with serve_process(store, served.fake.base_url, port=urlsplit(first.url).port or 0) as again:
        ended = follow_to_end(again.url, current_id(page))
        assert "event: ended" in ended
        assert '"status":"completed"' in ended
        expect(page.locator(".outcome")).to_have_count(0)
        expect(page.locator("#link")).to_be_visible()
        page.context.set_offline(False)
        expect(page.locator(".outcome")).to_have_attribute("data-status", "completed")
        expect(page.locator("#link")).to_be_hidden()
    # It did not wait for its next round (seconds away by then): back online, it tried at once.
    online_at: float = page.evaluate("window.onlineAt")
    fetched: list[float] = page.evaluate("window.eventsFetched")
    assert min(t for t in fetched if t >= online_at) - online_at < 0.3, (online_at, fetched)
    expect(answer(page)).to_have_text("".join(TAKEN_OVER_ANSWER))
    expect(page.locator(".divider.labelled")).to_contain_text("taken over from")
    assert page.locator("#messages").inner_text().count("r0 r1 r2") == 1
    assert_each_event_once(row_ids(page))
    assert_no_raw_error(page)


def test_a_204_shows_the_stored_ending(served: Served, page: Page) -> None:
    """A reattach the server answers 204 (the invocation ended; nothing after the cursor): the
    page reads the invocation's status and shows its ending.  The page's own cursor is the
    newest event only once it saw the ending, so here its reattach is cut off (the page is
    reloaded mid-answer while its /events requests fail), the run ends, and the cursor is
    set to the invocation's newest event on the way, as if every frame had come."""
    connect(page, served.url)
    send(page, "recover 30: then 204")
    expect(answer(page)).to_contain_text("w0 w1 ")
    page.route("**/events", lambda route: route.abort())
    page.reload()
    expect(page.locator("#link")).to_contain_text("Connection lost")
    invocation_id = current_id(page)
    assert "event: ended" in follow_to_end(served.url, invocation_id)
    with httpx2.Client(base_url=served.url, headers=auth(ALICE)) as http:
        head = http.get(f"/invocations/{invocation_id}").json()["last_event_id"]
    answered: list[int] = []

    def at_head(route: Route) -> None:
        response = route.fetch(headers={**route.request.headers, "last-event-id": head})
        answered.append(response.status)
        route.fulfill(response=response)

    # Routes added later come first: the page's next round reattaches through this one.  (An
    # unroute would let a request the first route holds through to the server unchanged.)
    page.route("**/events", at_head)
    outcome = page.locator(".outcome")
    expect(outcome).to_have_attribute("data-status", "completed")
    assert answered == [204]
    expect(page.locator("#link")).to_be_hidden()
    expect(page.locator("#chat-status")).to_have_text("completed")
    expect(page.locator("#send")).to_be_visible()
    expect(page.locator('#events .row[data-kind="ended"]')).to_have_count(1)
    assert_no_raw_error(page)
