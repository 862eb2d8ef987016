"""The dev UI's live mode in a real browser: a person talks to a LiveAgent's app.

Chromium runs with a fake microphone fed from a WAV file made here (a 440 Hz tone at 48 kHz,
``--use-file-for-fake-audio-capture``) and grants the microphone without asking.  The
server - ``create_app(ui=True)`` on Hypercorn with two LiveAgent apps, each on a fake realtime
server of its own (push to talk: no server turn detection; voice detection: server VAD) - runs
in a thread of its own with its own ``trio.run``.  The assertions are on what the fake
realtime servers recorded: the audio appended, ``response.cancel``, the truncate's
``audio_end_ms`` and the conversation the server keeps (only what was heard).  Nothing sleeps:
every wait is on a page condition or on the fake servers' records.

A screenshot at phone width is kept in ``$TRIO_AGENTS_ARTIFACTS/ui-live/`` when that is set,
else in ``ui-live/`` under pytest's temporary directory for the run.
"""

from __future__ import annotations

import base64
import itertools
import math
import os
import queue
import struct
import wave
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TypeVar

import attrs
import pytest
import trio
from playwright.sync_api import Browser, Page, ViewportSize, expect, sync_playwright

from trio_agents import Agent, Runner
from trio_agents.agents import AgentLike
from trio_agents.live import LiveAgent
from trio_agents.models import OpenAIRealtime
from trio_agents.models.scripted import ScriptedModel
from trio_agents.server import create_app, serve
from trio_agents.testing.realtime import (
    FakeRealtimeServer,
    RealtimeReply,
    open_fake_realtime_server,
)

from ._helpers import served_in_thread
from ._server import ALICE, TOKENS
from .test_ui_browser_layout import assert_no_sideways_scroll, assert_on_screen

T = TypeVar("T")

WAIT_MS = 10_000
TONE_HZ = 440.0
STORY = tuple(f"w{i}" for i in range(80))  # 8 s of audio, 100 ms a word


@attrs.define
class Served:
    url: str
    ptt: FakeRealtimeServer  # app "voice-ptt": turns are the page's commits
    vad: FakeRealtimeServer  # app "voice-vad": the server detects turns
    drop: FakeRealtimeServer  # app "voice-drop": drops the socket mid-answer, then answers
    token: trio.lowlevel.TrioToken

    def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        async def bounded() -> T:
            with trio.fail_after(10):
                return await fn()

        return trio.from_thread.run(bounded, trio_token=self.token)

    def read(self, fn: Callable[[], T]) -> T:
        return trio.from_thread.run_sync(fn, trio_token=self.token)


async def _serve(ready: queue.Queue[Served | BaseException], stop: trio.Event) -> None:
    # Push to talk: the story arrives twice as fast as it plays, so what was received
    # runs far ahead of what was heard.  Voice detection: the person starts talking after
    # 20 chunks of the answer (2 s of audio received, sent in 0.5 s).
    async with (
        open_fake_realtime_server(
            [RealtimeReply(words=STORY), RealtimeReply(words=STORY[:40])], pace=0.5
        ) as ptt,
        open_fake_realtime_server(
            [RealtimeReply(words=STORY[:40], speech_started_after=20)], pace=0.25
        ) as vad,
        open_fake_realtime_server(
            [RealtimeReply(words=STORY[:40], drop_after=3), RealtimeReply(words=("back",))],
            pace=0.25,
        ) as drop,
        Runner() as runner,
        trio.open_nursery() as nursery,
    ):
        agents: list[AgentLike] = [
            Agent(name="chat", model=ScriptedModel([])),  # not live: no live bar
            LiveAgent(
                name="voice-ptt",
                model=OpenAIRealtime(
                    "gpt-realtime", base_url=ptt.url, api_key="sk-fake", turn_detection=None
                ),
            ),
            LiveAgent(
                name="voice-vad",
                model=OpenAIRealtime("gpt-realtime", base_url=vad.url, api_key="sk-fake"),
            ),
            LiveAgent(
                name="voice-drop",
                model=OpenAIRealtime(
                    "gpt-realtime", base_url=drop.url, api_key="sk-fake", turn_detection=None
                ),
            ),
        ]
        app = create_app(agents, runner=runner, tokens=TOKENS, ui=True)
        bound: list[str] = await nursery.start(
            partial(serve, app, host="127.0.0.1", port=0, shutdown_trigger=stop.wait)
        )
        ready.put(Served(bound[0], ptt, vad, drop, trio.lowlevel.current_trio_token()))


@pytest.fixture(scope="module")
def served(chromium_path: str) -> Iterator[Served]:
    with served_in_thread(_serve) as got:
        yield got


def write_tone(path: Path, seconds: float = 2.0, rate: int = 48_000) -> None:
    """A 16-bit mono WAV of a 440 Hz tone (the fake microphone loops it)."""
    samples = (
        int(0.5 * 32767 * math.sin(2 * math.pi * TONE_HZ * n / rate))
        for n in range(int(seconds * rate))
    )
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(b"".join(struct.pack("<h", s) for s in samples))


@pytest.fixture(scope="module")
def browser(chromium_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    tone = tmp_path_factory.mktemp("mic") / "tone.wav"
    write_tone(tone)
    args = [
        "--use-fake-device-for-media-stream",
        "--use-fake-ui-for-media-stream",
        f"--use-file-for-fake-audio-capture={tone}",
        "--autoplay-policy=no-user-gesture-required",
    ]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium_path, headless=True, args=args
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = os.environ.get("TRIO_AGENTS_ARTIFACTS")
    where = Path(root) / "ui-live" if root else tmp_path_factory.mktemp("ui-live")
    where.mkdir(parents=True, exist_ok=True)
    return where


def open_page(browser: Browser, errors: list[str], *, phone: bool = False) -> Page:
    size: ViewportSize = {"width": 390, "height": 844} if phone else {"width": 1280, "height": 860}
    context = browser.new_context(viewport=size, has_touch=phone, permissions=["microphone"])
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "warning" else None)
    return page


@pytest.fixture
def errors() -> Iterator[list[str]]:
    found: list[str] = []
    yield found
    assert found == [], f"the page raised or warned: {found}"


def connect(page: Page, url: str, app: str) -> None:
    page.goto(f"{url}/ui/")
    page.fill("#user", "alice")
    page.fill("#token", ALICE)
    page.click("#auth button[type=submit]")
    expect(page.locator("#mode")).to_have_text("token")
    page.select_option("#app", app)
    expect(page.locator("#live")).to_be_visible()


def appended(fake: FakeRealtimeServer) -> bytes:
    """The audio the fake server received, PCM16 bytes."""
    return b"".join(
        base64.b64decode(e.data["audio"])
        for e in fake.received
        if e.type == "input_audio_buffer.append"
    )


def tone_of(pcm: bytes, rate: int = 24_000) -> tuple[float, float]:
    """The RMS (of full scale) and the frequency (from zero crossings) of PCM16 mono."""
    values = struct.unpack(f"<{len(pcm) // 2}h", pcm)
    values = values[len(values) // 4 :]  # past the start of the capture
    rms = math.sqrt(sum(v * v for v in values) / len(values)) / 32768
    crossings = sum(1 for a, b in itertools.pairwise(values) if a < 0 <= b)
    return rms, crossings / (len(values) / rate)


def heard_text(fake: FakeRealtimeServer) -> str:
    [item] = [i for i in fake.view() if i["role"] == "assistant"]
    assert "truncated_at_ms" in item, item
    return str(item["text"])


def events_after(fake: FakeRealtimeServer, kind: str) -> list[str]:
    types = fake.types()
    return types[types.index(kind) :]


# ==== the tests ==================================================================================


def test_push_to_talk_streams_the_microphone_and_interrupt_truncates_at_the_played_position(
    served: Served, browser: Browser, errors: list[str]
) -> None:
    """Holding Talk streams the microphone as 24 kHz PCM16 (the tone arrives at 440 Hz);
    letting go commits and the model answers; Interrupt mid-answer sends response.cancel,
    then a truncate at the position the page played (far behind what it received), and the
    transcript keeps only the heard words.  Pressing Talk over the next answer interrupts
    it the same way."""
    page = open_page(browser, errors)
    page.goto(f"{served.url}/ui/")
    page.fill("#user", "alice")
    page.fill("#token", ALICE)
    page.click("#auth button[type=submit]")
    expect(page.locator("#app")).to_have_value("chat")
    expect(page.locator("#session-list")).to_contain_text("No sessions yet")
    expect(page.locator("#live")).to_be_hidden()
    listed = page.request.get(
        f"{served.url}/ui/live-apps", headers={"Authorization": f"Bearer {ALICE}"}
    )
    assert listed.json() == ["voice-drop", "voice-ptt", "voice-vad"]
    assert page.request.get(f"{served.url}/ui/live-apps").status == 401
    connect(page, served.url, "voice-ptt")
    expect(page.locator("#live-talk")).to_be_hidden()
    page.click("#live-start")
    expect(page.locator("#live-state")).to_have_text("live: hold Talk to speak")
    served.call(lambda: served.ptt.wait_for("session.update"))
    talk = page.locator("#live-talk")
    talk.hover()
    page.mouse.down()
    expect(talk).to_have_class("talk held")
    served.call(lambda: served.ptt.wait_for("input_audio_buffer.append", 8))
    page.mouse.up()
    served.call(lambda: served.ptt.wait_for("response.create"))
    rms, hz = tone_of(served.read(lambda: appended(served.ptt)))
    assert rms > 0.05, rms
    assert abs(hz - TONE_HZ) < 20, hz
    types = served.read(lambda: served.ptt.types())
    assert types.index("input_audio_buffer.commit") < types.index("response.create")
    expect(page.locator(".bubble.user").last).to_have_text("(audio)")

    answer = page.locator(".bubble.assistant.live .text").last
    expect(answer).to_contain_text("w20 w21")  # the text runs ahead of the audio
    page.wait_for_function("Number(document.getElementById('live').dataset.played) >= 400")
    shown = answer.text_content() or ""
    page.click("#live-interrupt")
    truncate = served.call(lambda: served.ptt.wait_for("conversation.item.truncate"))
    played = int(page.locator("#live").get_attribute("data-played") or "-1")
    received = int(page.locator("#live").get_attribute("data-received") or "-1")
    after = served.read(lambda: events_after(served.ptt, "response.cancel"))
    assert after[:2] == ["response.cancel", "conversation.item.truncate"], after
    end = truncate.data["audio_end_ms"]
    assert end == played, (end, played)
    assert 400 <= end < received - 300, (end, received)  # the played position, not received
    heard = served.read(lambda: heard_text(served.ptt))
    expect(answer).to_have_text(heard)
    assert heard == " ".join(STORY[: end // 100])
    assert len(shown.split()) > len(heard.split()) + 5, (shown, heard)
    bubble = page.locator(".bubble.assistant.live").last
    expect(bubble).to_have_attribute("data-status", "interrupted")
    expect(bubble.locator(".meta")).to_contain_text(f"at {end} ms")

    # Talking over the next answer: pressing Talk interrupts it where it is.
    first_item = page.locator("#live").get_attribute("data-item")
    talk.hover()
    page.mouse.down()
    served.call(lambda: served.ptt.wait_for("input_audio_buffer.append", 16))
    page.mouse.up()
    served.call(lambda: served.ptt.wait_for("response.create", 2))
    page.wait_for_function(
        "([first]) => { const d = document.getElementById('live').dataset;"
        " return d.item !== first && Number(d.played) >= 300; }",
        arg=[first_item],
    )
    talk.hover()
    page.mouse.down()
    second = served.call(lambda: served.ptt.wait_for("conversation.item.truncate", 2))
    assert second.data["item_id"] != truncate.data["item_id"]
    assert second.data["audio_end_ms"] == int(
        page.locator("#live").get_attribute("data-played") or "-1"
    )
    assert served.read(lambda: served.ptt.types()).count("response.cancel") == 2
    page.mouse.up()

    page.click("#live-stop")
    expect(page.locator("#live-state")).to_have_text("live session ended")
    closed = served.call(lambda: served.ptt.wait_closed())
    assert closed.by == "client"
    expect(page.locator("#live-start")).to_be_visible()
    page.context.close()


def test_voice_detection_barge_in_at_phone_width(
    served: Served, browser: Browser, errors: list[str], shots: Path
) -> None:
    """Under voice detection the microphone streams without a button; the server's
    speech_started mid-answer makes the session cancel and truncate at the position the page
    reported playing (behind the audio received); the page stops the audio and shows only
    what was heard.  At phone width Interrupt and Stop are on screen; Stop ends it."""
    page = open_page(browser, errors, phone=True)
    connect(page, served.url, "voice-vad")
    page.select_option("#live-mode", "vad")
    page.click("#live-start")
    expect(page.locator("#live-state")).to_have_text("live: listening")
    expect(page.locator("#live-talk")).to_be_hidden()
    served.call(lambda: served.vad.wait_for("input_audio_buffer.append", 5))
    rms, hz = tone_of(served.read(lambda: appended(served.vad)))
    assert rms > 0.05, rms
    assert abs(hz - TONE_HZ) < 20, hz

    served.call(lambda: served.vad.user_speaks("tell me a story"))
    expect(page.locator(".bubble.user").last).to_have_text("tell me a story")
    truncate = served.call(lambda: served.vad.wait_for("conversation.item.truncate"))
    after = served.read(lambda: events_after(served.vad, "response.cancel"))
    assert after[:2] == ["response.cancel", "conversation.item.truncate"], after
    end = truncate.data["audio_end_ms"]
    assert 0 < end <= 1500, end  # 2000 ms had been received: the played position is behind
    heard = served.read(lambda: heard_text(served.vad))
    assert heard == " ".join(STORY[: end // 100])
    answer = page.locator(".bubble.assistant.live").last
    expect(answer).to_have_attribute("data-status", "interrupted")
    expect(answer.locator(".text")).to_have_text(heard)
    expect(page.locator("#live")).to_have_attribute("data-live", "on")

    for selector in ("#live-interrupt", "#live-stop", "#message"):
        assert_on_screen(page, selector)
    assert_no_sideways_scroll(page)
    page.screenshot(path=str(shots / "live-phone.png"))
    page.click("#live-stop")
    expect(page.locator("#live-state")).to_have_text("live session ended")
    closed = served.call(lambda: served.vad.wait_closed())
    assert closed.by == "client"
    # Reopened (a reload), the session is drawn from its journal: the person's words and
    # only the heard part of the answer.
    page.reload()
    expect(page.locator(".bubble.user")).to_have_text(["tell me a story"])
    expect(page.locator(".bubble.assistant .text")).to_have_text([heard])
    page.context.close()


def restored_items(fake: FakeRealtimeServer, connection: int) -> list[tuple[str, str]]:
    """The messages the page's session put into the conversation of ``connection``."""
    return [
        (e.data["item"]["role"], e.data["item"]["content"][0]["text"])
        for e in fake.received
        if e.connection == connection and e.type == "conversation.item.create"
    ]


def test_a_live_session_whose_socket_dropped_is_resumed_from_the_page(
    served: Served, browser: Browser, errors: list[str]
) -> None:
    """The upstream socket drops mid-answer: the session ends failed, the page says why and
    offers Resume; reloaded, the session is drawn from its journal and still offers Resume
    (the session's newest live session failed); Resume reopens the same live session on a new
    upstream socket, the person's turn put back into its conversation first, and it goes on
    with the transcript intact.  Stopped (completed), it offers Resume no more."""
    page = open_page(browser, errors)
    connect(page, served.url, "voice-drop")
    resume = page.locator("#live-resume")
    expect(resume).to_be_hidden()
    page.click("#live-start")
    expect(page.locator("#live-state")).to_have_text("live: hold Talk to speak")
    invocation = page.locator("#live").get_attribute("data-invocation")
    assert invocation
    page.fill("#message", "tell me a story")
    page.press("#message", "Enter")
    expect(page.locator("#live-state")).to_contain_text(
        "the session failed: [openai-realtime] the realtime socket closed"
    )
    served.call(lambda: served.drop.wait_closed())
    expect(resume).to_be_visible()
    expect(resume).to_have_attribute("data-invocation", invocation)
    expect(page.locator("#live-start")).to_be_visible()

    page.reload()
    expect(page.locator(".bubble.user")).to_have_text(["tell me a story"])
    expect(resume).to_be_visible()
    resume.click()
    expect(page.locator("#live-state")).to_have_text("live: hold Talk to speak")
    expect(page.locator("#live")).to_have_attribute("data-invocation", invocation)
    expect(resume).to_be_hidden()
    # The first socket's one item (the person's message), then the second's restored one.
    served.call(lambda: served.drop.wait_for("conversation.item.create", 2))
    restored = served.read(lambda: restored_items(served.drop, 2))
    assert restored[0] == ("user", "tell me a story"), restored
    assert [role for role, _ in restored[1:]] in ([], ["assistant"]), restored  # what was heard
    page.fill("#message", "are you back?")
    page.press("#message", "Enter")
    expect(page.locator(".bubble.assistant.live .text").last).to_have_text("back")
    expect(page.locator(".bubble.user")).to_have_text(["tell me a story", "are you back?"])
    page.click("#live-stop")
    expect(page.locator("#live-state")).to_have_text("live session ended")
    expect(resume).to_be_hidden()
    page.reload()
    expect(page.locator(".bubble.user")).to_have_text(["tell me a story", "are you back?"])
    expect(resume).to_be_hidden()
    page.context.close()
