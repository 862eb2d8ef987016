// Drives the official AG-UI client (@ag-ui/client) against POST /ag-ui/{app}, for
// tests/test_agui_node.py.  One JSON line on stdout per thing that happened:
//   {"event": {...}}        every event the client's pipeline applied (after its own checks)
//   {"interrupts": [...]}   the client's pendingInterrupts after a run
//   {"done": {...}}         a run resolved ({result, newMessages})
//   {"error": "..."}        a run rejected (RUN_ERROR, a verification failure, HTTP errors)
//   {"aborted": true}       abortRun() was called
// Usage: node client.mjs URL TOKEN SCENARIO
//   stream     one run of "go"
//   abort      one run of "go", aborted after the first TEXT_MESSAGE_CONTENT
//   watch      one run of "go", to its end (the test cancels it from outside)
//   interrupt  a run of "ship" that ends in an interrupt, then a run that resumes it
//              (approved with {"service": "web"})
import { HttpAgent } from "@ag-ui/client";

const [url, token, scenario] = process.argv.slice(2);
const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

const agent = new HttpAgent({
  url,
  headers: { Authorization: `Bearer ${token}` },
  threadId: "thread-1",
});

let abortAfterContent = scenario === "abort";
const subscriber = {
  onEvent({ event }) {
    out({ event });
    if (abortAfterContent && event.type === "TEXT_MESSAGE_CONTENT") {
      abortAfterContent = false;
      agent.abortRun();
      out({ aborted: true });
    }
  },
};

async function run(text, parameters) {
  if (text !== null) {
    agent.addMessage({ id: `m${agent.messages.length}`, role: "user", content: text });
  }
  try {
    const done = await agent.runAgent(parameters, subscriber);
    out({ done });
  } catch (error) {
    out({ error: String(error && error.message ? error.message : error) });
  }
  out({ interrupts: agent.pendingInterrupts });
}

if (scenario === "interrupt") {
  await run("ship");
  const resume = agent.pendingInterrupts.map((interrupt) => ({
    interruptId: interrupt.id,
    status: "resolved",
    payload: { approved: true, arguments: { service: "web" } },
  }));
  await run(null, { resume });
} else {
  await run("go");
}
out({ exit: true });
