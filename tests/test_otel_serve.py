"""``trio-agents serve --otel``: a real server process exports its spans and metrics as the
standard ``OTEL_*`` variables say (here the SDK's console exporters), with the trace context
of the request it served carried to the model's request."""

from __future__ import annotations

import os
import re
import signal
import subprocess

import httpx2
import trio

from trio_agents.testing import open_fake_openai_server, openai_stream

from .test_cli import ROOT, command

TRACE = "0af7651916cd43dd8448eb211c80319c"


async def test_serve_otel_exports_as_the_otel_variables_say(tmp_path: object) -> None:
    """One /run with a ``traceparent``; SIGTERM flushes the exporters: the invoke_agent and
    chat spans are in that trace, the token metric was exported, and the model server
    received the chat span's ``traceparent``."""
    async with open_fake_openai_server() as fake:
        fake.enqueue(openai_stream("hello"))
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "TRIO_AGENTS_TEST_MODEL_URL": fake.base_url,
            "OTEL_TRACES_EXPORTER": "console",
            "OTEL_METRICS_EXPORTER": "console",
            "OTEL_SERVICE_NAME": "otel-test",
        }
        argv = [*command(), "serve", "tests.server_agents:agent", "--insecure-dev", "--port", "0"]
        argv += ["--store", "memory://", "--no-ui", "--otel"]
        process = await trio.lowlevel.open_process(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE)
        try:
            assert process.stdout is not None
            seen = b""
            with trio.fail_after(30):
                while b"insecure dev mode" not in seen:
                    chunk = await process.stdout.receive_some()
                    assert chunk, seen
                    seen += chunk
            found = re.search(rb"serving talker at (http://\S+)", seen)
            assert found, seen
            async with httpx2.AsyncClient(base_url=found.group(1).decode(), timeout=30) as client:
                answer = await client.post(
                    "/run",
                    json={"app_name": "talker", "user_id": "u1", "input": "hi"},
                    headers={"traceparent": f"00-{TRACE}-b7ad6b7169203331-01"},
                )
            assert answer.status_code == 200, answer.text
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(30):
                while chunk := await process.stdout.receive_some():
                    seen += chunk
                assert await process.wait() == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        [record] = fake.requests
    out = seen.decode()
    assert '"name": "invoke_agent talker"' in out
    assert '"name": "chat fake-model"' in out
    assert out.count(f'"trace_id": "0x{TRACE}"') == 2
    assert '"gen_ai.client.token.usage"' in out
    assert '"service.name": "otel-test"' in out
    assert record.headers["traceparent"].startswith(f"00-{TRACE}-")
