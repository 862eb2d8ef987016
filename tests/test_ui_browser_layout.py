"""The dev UI as a person meets it, in a real browser (Debian's Chromium, Playwright's sync API):
at phone, tablet and desktop sizes, reopened elsewhere, stopped in steps, interrupted by a
new message.

The servers and the fake OpenAI server are those of :mod:`tests.test_ui_browser` (one set for
this module, in a thread of its own); one browser serves the whole module.  Nothing sleeps:
every wait is on a page condition or on what the fake model server recorded.

Screenshots: one per size and one of the reopened session, kept as test artifacts in
``$TRIO_AGENTS_ARTIFACTS/ui-layout/`` when that is set, else in ``ui-layout/`` under pytest's
temporary directory for the run (``pytest --basetemp=DIR`` to choose it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from .test_ui_browser import (
    WAIT_MS,
    Served,
    _last_user_text,
    answer,
    assert_each_event_once,
    browser,
    connect,
    row_ids,
    send,
    served,
)

__all__ = ["browser", "served"]  # the fixtures, shared with tests.test_ui_browser's setup

SIZES = {"phone": (390, 844), "tablet": (1024, 768), "desktop": (1440, 900)}


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go (see the module docstring)."""
    root = os.environ.get("TRIO_AGENTS_ARTIFACTS")
    where = Path(root) / "ui-layout" if root else tmp_path_factory.mktemp("ui-layout")
    where.mkdir(parents=True, exist_ok=True)
    return where


class Pages:
    """Opens pages at a size, each in a context of its own (another browser, as far as the
    page can tell: no shared storage); every page must end without an error or warning."""

    def __init__(self, browser: Browser) -> None:
        self.browser = browser
        self.contexts: list[BrowserContext] = []
        self.errors: list[str] = []

    def open(self, size: str) -> Page:
        width, height = SIZES[size]
        context = self.browser.new_context(
            viewport={"width": width, "height": height}, has_touch=size == "phone"
        )
        context.set_default_timeout(WAIT_MS)
        self.contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "warning" else None)
        return page


@pytest.fixture
def pages(browser: Browser) -> Iterator[Pages]:
    opened = Pages(browser)
    try:
        yield opened
    finally:
        for context in opened.contexts:
            context.close()
    assert opened.errors == [], f"the page raised or warned: {opened.errors}"


def box(page: Page, selector: str) -> dict[str, float]:
    found = page.locator(selector).bounding_box()
    assert found is not None, f"{selector} is not laid out"
    return {"x": found["x"], "y": found["y"], "width": found["width"], "height": found["height"]}


def assert_on_screen(page: Page, selector: str) -> None:
    """``selector`` is visible and wholly inside the viewport, and nothing covers its middle
    (a tap there reaches it)."""
    expect(page.locator(selector)).to_be_visible()
    size = page.viewport_size
    assert size is not None
    b = box(page, selector)
    assert b["x"] >= 0, (selector, b)
    assert b["y"] >= 0, (selector, b)
    assert b["x"] + b["width"] <= size["width"], (selector, b, size)
    assert b["y"] + b["height"] <= size["height"], (selector, b, size)
    hit = page.evaluate(
        "([sel, x, y]) => { const el = document.elementFromPoint(x, y);"
        " return !!el && document.querySelector(sel).contains(el); }",
        [selector, b["x"] + b["width"] / 2, b["y"] + b["height"] / 2],
    )
    assert hit, f"{selector} is covered at its middle"


def assert_no_sideways_scroll(page: Page) -> None:
    widths: list[int] = page.evaluate(
        "[document.documentElement.scrollWidth, document.body.scrollWidth, window.innerWidth]"
    )
    assert max(widths[:2]) <= widths[2], widths


def wait_disconnected(served: Served, request: Any) -> None:
    served.call(lambda: served.fake.wait_until(lambda: request.disconnected_at is not None))
    assert not request.completed


def open_events(page: Page) -> None:
    """The Events panel: a column on a wide screen, a drawer opened from the head below."""
    if page.locator("#show-events").is_visible():
        page.click("#show-events")
    expect(page.locator("#events-panel")).to_be_in_viewport(ratio=1)


@pytest.mark.parametrize("size", list(SIZES))
def test_stop_is_reachable_and_works_at_each_size(
    served: Served, pages: Pages, shots: Path, size: str
) -> None:
    """At 390x844 (and 360x640), 1024x768 and 1440x900: nothing scrolls sideways, the
    message box is wide enough to type in and stays enabled while the answer streams, Stop is
    on screen and uncovered, and a tap on it stops the answer (the fake model server saw its
    stream close); the Events panel can be reached and shows the stop."""
    page = pages.open(size)
    connect(page, served.url)
    assert_no_sideways_scroll(page)
    words = f"tell me a story at {size} size"
    send(page, words)
    expect(answer(page)).to_contain_text("w0 w1 w2 w3 ")
    [request] = served.requests_about(f"at {size} size")
    assert request.disconnected_at is None
    assert_no_sideways_scroll(page)
    assert_on_screen(page, "#stop")
    assert_on_screen(page, "#message")
    expect(page.locator("#message")).to_be_enabled()
    assert box(page, "#message")["width"] >= 300
    expect(page.locator("#chat-status")).to_have_text("running")
    page.screenshot(path=str(shots / f"{size}-streaming.png"))
    if size == "phone":  # the narrowest phone in use: the same holds
        page.set_viewport_size({"width": 360, "height": 640})
        assert_no_sideways_scroll(page)
        assert_on_screen(page, "#stop")
        assert box(page, "#message")["width"] >= 300
        page.set_viewport_size({"width": 390, "height": 844})
    if size == "phone":
        page.tap("#stop")  # a finger
    else:
        page.click("#stop")
    outcome = page.locator(".outcome")
    expect(outcome).to_have_attribute("data-status", "cancelled")
    wait_disconnected(served, request)
    expect(page.locator("#stop")).to_be_hidden()
    open_events(page)
    expect(page.locator('#events .row[data-kind="cancel_requested"]')).to_have_count(1)
    expect(page.locator('#events .row[data-kind="ended"]')).to_contain_text("cancelled")
    assert_no_sideways_scroll(page)
    page.screenshot(path=str(shots / f"{size}-stopped-events.png"))


def test_stop_after_the_turn_can_be_made_immediate(served: Served, pages: Pages) -> None:
    """Stop "after the turn" leaves the answer streaming (the model stream stays open) and
    Stop usable as "Stop now"; pressed, it stops at once (the stream closes).  The next
    answer's Stop starts at "immediately" again."""
    page = pages.open("desktop")
    connect(page, served.url)
    send(page, "a story to stop in two steps")
    expect(answer(page)).to_contain_text("w0 w1 w2 ")
    [request] = served.requests_about("two steps")
    page.select_option("#stop-mode", "after_turn")
    page.click("#stop")
    expect(page.locator("#chat-status")).to_have_text("stopping after the turn")
    expect(page.locator("#stop")).to_have_text("Stop now")
    expect(page.locator("#stop")).to_be_enabled()
    expect(page.locator('#events .row[data-kind="cancel_requested"]')).to_contain_text("after_turn")
    # Still streaming: a stop after the turn lets the turn finish.
    streamed = len(answer(page).inner_text())
    expect(answer(page)).not_to_have_text(answer(page).inner_text())
    assert len(answer(page).inner_text()) > streamed
    assert request.disconnected_at is None
    assert page.locator("#stop-mode").input_value() == "immediate"
    assert page.locator('#stop-mode option[value="after_turn"]').is_disabled()
    page.click("#stop")
    outcome = page.locator(".outcome")
    expect(outcome).to_have_attribute("data-status", "cancelled")
    wait_disconnected(served, request)
    expect(outcome).to_contain_text("stopped from the dev UI")  # the first reason stands
    # Cut off mid-stream, no usage was reported: no made-up "0 in · 0 out".
    expect(outcome.locator(".tokens")).to_have_count(0)
    # The next answer starts afresh.
    send(page, "another story, stopped at once")
    expect(answer(page)).to_contain_text("w0 w1 ")
    assert page.locator("#stop-mode").input_value() == "immediate"
    expect(page.locator("#stop")).to_have_text("Stop")
    expect(page.locator("#chat-status")).to_have_text("running")
    [second] = served.requests_about("stopped at once")
    page.click("#stop")
    expect(page.locator(".outcome")).to_have_count(2)
    expect(page.locator(".outcome").last).to_have_attribute("data-status", "cancelled")
    wait_disconnected(served, second)


def test_a_message_sent_mid_answer_preempts_it(served: Served, pages: Pages) -> None:
    """The message box stays usable while an answer streams; sending cuts that answer off
    (its model stream closes, its ending says why) and the new message is answered."""
    page = pages.open("tablet")
    connect(page, served.url)
    send(page, "a story to interrupt")
    expect(answer(page)).to_contain_text("w0 w1 w2 ")
    [request] = served.requests_about("to interrupt")
    expect(page.locator("#message")).to_be_enabled()
    send(page, "never mind, hello")
    first = page.locator(".outcome").first
    expect(first).to_have_attribute("data-status", "cancelled")
    expect(first).to_contain_text("preempted by a new message")
    wait_disconnected(served, request)
    expect(page.locator(".outcome")).to_have_count(2)
    expect(page.locator(".outcome").last).to_have_attribute("data-status", "completed")
    expect(answer(page)).to_have_text("Hello there!")
    expect(page.locator(".bubble.user")).to_have_text(["a story to interrupt", "never mind, hello"])
    expect(page.locator(".bubble.interrupted")).to_have_count(1)
    expect(page.locator("#message")).to_have_value("")


def test_a_reopened_session_looks_as_it_did_live(served: Served, pages: Pages, shots: Path) -> None:
    """A session with a tool call, an approval approved, one cancelled while it waited and
    an answer stopped mid-stream, opened in another browser (at phone size, from the list,
    where it has its first message as title): the same tool call with its result, both
    approval cards with their arguments, every ending, the timeline of each answer from the
    store, and Resume on the stopped answer - which resumes it."""
    live = pages.open("desktop")
    connect(live, served.url)
    send(live, "weather in Paris, to reopen")
    expect(live.locator(".outcome")).to_have_attribute("data-status", "completed")
    send(live, "deploy api")
    card = live.locator(".approval.open")
    expect(live.locator("#chat-status")).to_have_text("waiting for approval")
    card.locator(".approve").click()
    expect(live.locator(".outcome")).to_have_count(2)
    expect(live.locator(".outcome").last).to_have_attribute("data-status", "completed")
    send(live, "deploy cache")
    expect(live.locator(".approval.open")).to_have_count(1)
    expect(live.locator("#chat-status")).to_have_text("waiting for approval")
    live.click("#stop")
    expect(live.locator(".outcome")).to_have_count(3)
    expect(live.locator(".outcome").last).to_have_attribute("data-status", "cancelled")
    cancelled = live.locator(".approval").last
    expect(cancelled).to_have_attribute("data-state", "cancelled")
    expect(cancelled.locator(".final-args")).to_be_visible()
    expect(cancelled.locator(".final-args")).to_contain_text('"service": "cache"')
    send(live, "then a story, stopped")
    expect(answer(live)).to_contain_text("w0 w1 w2 w3 ")
    live.click("#stop")
    expect(live.locator(".outcome")).to_have_count(4)
    expect(live.locator(".outcome").last).to_have_attribute("data-status", "cancelled")
    live_text = live.locator("#messages").inner_text()
    live_rows = row_ids(live)
    assert served.deployed.count("cache") == 0

    page = pages.open("phone")
    connect(page, served.url)
    page.click("#show-sessions")
    listed = page.locator(".session", has_text="weather in Paris, to reopen")
    expect(listed).to_contain_text("just now")
    listed.click()
    expect(page.locator("#sessions-panel")).not_to_be_in_viewport()
    expect(page.locator("#chat-title")).to_have_text("weather in Paris, to reopen")
    expect(page.locator(".outcome")).to_have_count(4)
    statuses = page.locator(".outcome").evaluate_all("os => os.map(o => o.dataset.status)")
    assert statuses == ["completed", "completed", "cancelled", "cancelled"]
    # Tokens as the model server reported them; none for the answer cut off mid-stream.
    expect(page.locator(".outcome").first.locator(".tokens")).to_have_text(
        re.compile(r"^[1-9]\d* in · [1-9]\d* out tokens$")
    )
    expect(page.locator(".outcome").last.locator(".tokens")).to_have_count(0)
    expect(page.locator(".tool", has_text="deploy").last.locator(".tool-state")).to_have_text(
        "not run (cancelled)"
    )
    tool = page.locator(".tool", has_text="lookup")
    expect(tool.locator(".tool-state")).to_have_text("done")
    expect(tool.locator(".result")).to_have_text("sunny in Paris")
    approvals = page.locator(".approval")
    expect(approvals).to_have_count(2)
    expect(approvals.first).to_have_attribute("data-state", "approved")
    expect(approvals.first.locator(".final-args")).to_contain_text('"service": "api"')
    expect(approvals.last).to_have_attribute("data-state", "cancelled")
    expect(approvals.last.locator(".final-args")).to_contain_text('"service": "cache"')
    expect(answer(page)).to_contain_text("w0 w1 w2 w3 ")
    expect(page.locator(".bubble.interrupted")).to_have_count(1)
    assert page.locator("#messages").inner_text() == live_text
    expect(page.locator(".outcome .resume")).to_have_count(1)
    expect(page.locator(".outcome").last.locator(".resume")).to_be_enabled()
    # The last answer's timeline, from the store: the one drawn live, cancel and all.
    assert row_ids(page) == live_rows
    assert_each_event_once(row_ids(page))
    kinds = page.locator("#events .row").evaluate_all("rs => rs.map(r => r.dataset.kind)")
    assert "cancel_requested" in kinds
    assert kinds[-1] == "ended"
    assert_no_sideways_scroll(page)
    page.screenshot(path=str(shots / "phone-reopened.png"))
    # An earlier answer's timeline, from its ending's "events".
    page.locator(".outcome").first.locator(".show-events").click()
    expect(page.locator("#events-panel")).to_be_in_viewport(ratio=1)
    expect(page.locator('#events .row[data-kind="tool_call_finished"]')).to_contain_text(
        "sunny in Paris"
    )
    page.screenshot(path=str(shots / "phone-reopened-events.png"))
    page.keyboard.press("Escape")
    expect(page.locator("#events-panel")).not_to_be_in_viewport()
    # Resume the stopped story here: it runs on, and stops again.
    [story] = served.requests_about("then a story")
    page.locator(".outcome .resume").click()
    expect(page.locator("#chat-status")).to_have_text("running")
    expect(page.locator('#events .row[data-kind="started"]')).to_have_count(2)
    served.call(
        lambda: served.fake.wait_until(
            lambda: (
                sum("then a story" in _last_user_text(r.json) for r in served.fake.requests) == 2
            )
        )
    )
    [resumed] = [r for r in served.requests_about("then a story") if r is not story]
    assert_on_screen(page, "#stop")
    page.click("#stop")
    expect(page.locator(".outcome")).to_have_count(5)
    expect(page.locator(".outcome").last).to_have_attribute("data-status", "cancelled")
    wait_disconnected(served, resumed)
    assert_each_event_once(row_ids(page))
