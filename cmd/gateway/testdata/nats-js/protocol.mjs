// natsagent's NATS contract (docs/protocol.md 2) spoken by the official
// NATS JavaScript client v3, against gateway --dev's NATS server
// (cmd/gateway's TestJSClient runs it, with NATS_URL). No natsagent code
// on this side: subjects, headers and JSON come from the protocol doc.
//
// It serves a remote tool (2.18) as a micro service endpoint, prints "tool
// served", and waits for a line on stdin (the Go test sends it once a
// worker has found the tool). Then it submits runs with JetStream publishes
// (2.1), follows their events with ordered consumers (2.11), reads their
// records from the agent_runs bucket (2.15), cancels one (2.12) and steers
// another (2.13). Every check prints "ok: ..."; the first failure exits 1;
// the last line is "checks passed: N".
import { once } from "node:events";
import { createInterface } from "node:readline";
import { connect } from "@nats-io/transport-node";
import { DeliverPolicy, jetstream } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { Svcm } from "@nats-io/services";

const tenant = "default";
let passed = 0;

function check(ok, what, got) {
  if (!ok) {
    console.log(`FAIL: ${what}` + (got === undefined ? "" : `: got ${JSON.stringify(got)}`));
    process.exit(1);
  }
  passed++;
  console.log(`ok: ${what}`);
}

const nc = await connect({ servers: process.env.NATS_URL, name: "natsagent-js-compat" });
const js = jetstream(nc);
const runs = await new Kvm(nc).open("agent_runs");

// The tool: upper-cases its text, and notes who called (2.18's headers).
const calls = [];
const svc = await new Svcm(nc).add({ name: "shout", version: "1.0.0", metadata: { natsagent: "tools" } });
svc.addEndpoint("shout-default", {
  subject: `agent.tools.${tenant}.shout`,
  metadata: {
    description: "Returns the text in upper case.",
    schema: JSON.stringify({ type: "object", properties: { text: { type: "string" } }, required: ["text"] }),
  },
  handler: (err, msg) => {
    if (err) {
      console.log(`FAIL: the tool endpoint: ${err}`);
      process.exit(1);
    }
    const h = msg.headers;
    calls.push({
      tenant: h?.get("Natsagent-Tenant"), run: h?.get("Natsagent-Run"), thread: h?.get("Natsagent-Thread"),
      callID: h?.get("Natsagent-Tool-Call-Id"), deadline: h?.get("Natsagent-Deadline"),
    });
    msg.respond(String(msg.json().text).toUpperCase());
  },
});
await nc.flush();
nc.publish("agent.tools.refresh", "");
await nc.flush();
console.log("tool served");
const stdin = createInterface({ input: process.stdin });
await once(stdin, "line");
stdin.close();

// submit publishes a run request to JetStream with its message id.
function submit(thread, run, text, extra = {}) {
  const req = { run_id: run, thread_id: thread, input: { messages: [{ role: "user", content: text }] }, ...extra };
  return js.publish(`agent.runs.${tenant}.${thread}`, JSON.stringify(req), { msgID: `${tenant}.${run}` });
}

// follow reads a run's stored events from the start with an ordered
// consumer up to run.finished; onEvent sees each as it comes.
async function follow(thread, run, onEvent = () => {}) {
  const c = await js.consumers.get("AGENT_EVENTS", {
    filter_subjects: `agent.events.${tenant}.${thread}.${run}.>`, deliver_policy: DeliverPolicy.All,
  });
  const events = [];
  const msgs = await c.consume();
  for await (const m of msgs) {
    const e = m.json();
    events.push(e);
    onEvent(e);
    if (e.type === "run.finished") break;
  }
  await msgs.close();
  return events;
}

// started follows a run and resolves started once it runs; done resolves
// to all its events.
function followStarted(thread, run) {
  let started;
  const isStarted = new Promise((resolve) => (started = resolve));
  const done = follow(thread, run, (e) => e.type === "run.started" && started());
  return { started: Promise.race([isStarted, done]), done };
}

function checkSequence(run, events) {
  const seqs = events.map((e) => e.seq);
  check(seqs.every((s, i) => s === i + 1), `${run}: stored events numbered 1..${seqs.length} in order`, seqs);
  check(events.every((e) => e.run_id === run && e.tenant === tenant && e.v === 2), `${run}: every envelope names the run, the tenant and v2`);
  check(["run.queued", "run.started"].includes(events[0].type), `${run}: the first event is run.queued or run.started`, events[0].type);
  check(events.filter((e) => e.type === "run.finished").length === 1, `${run}: one run.finished, the last event`);
}

async function record(run) {
  const e = await runs.get(`${tenant}.${run}`);
  return e?.json();
}

// 1. A run whose model calls the tool served above.
const ack = await submit("js-tool", "js-tool", "shout hello from js");
check(ack.stream === "AGENT_RUNS" && ack.seq > 0 && !ack.duplicate, "the run request is stored in AGENT_RUNS", ack);
const again = await submit("js-tool", "js-tool", "shout hello from js");
check(again.duplicate === true && again.seq === ack.seq, "the same message id again is a duplicate of it", again);
const events = await follow("js-tool", "js-tool");
checkSequence("js-tool", events);
const started = events.find((e) => e.type === "tool.started");
const finishedTool = events.find((e) => e.type === "tool.finished");
check(started?.data.name === "remote__shout", "the model called remote__shout", started?.data);
check(finishedTool?.data.status === "success" && finishedTool.data.result === "HELLO FROM JS", "tool.finished carries the tool's result", finishedTool?.data);
check(calls.length === 1, "the tool was called once", calls.length);
const call = calls[0];
check(call.tenant === tenant && call.run === "js-tool" && call.thread === "js-tool" && call.callID === started.data.tool_call_id,
  "the call's headers name the tenant, thread, run and tool call", call);
check(!Number.isNaN(Date.parse(call.deadline)), "the call carries a deadline", call.deadline);
const fin = events.at(-1);
check(fin.data.status === "success" && fin.data.output?.content === "got: HELLO FROM JS", "run.finished: success, with the answer", fin.data);
const rec = await record("js-tool");
check(rec?.status === "success" && rec.thread_id === "js-tool" && rec.output?.content === "got: HELLO FROM JS", "the record says success, with the answer", rec);

// 2. Cancel a running run: the reply and the record say cancelled.
const c = followStarted("js-cancel", "js-cancel");
await submit("js-cancel", "js-cancel", "slow count");
await c.started;
const reply = (await nc.request(`agent.ctl.${tenant}.js-cancel.js-cancel.cancel`, "", { timeout: 30000 })).json();
check(reply.run_id === "js-cancel" && reply.status === "cancelled", "the cancel reply says cancelled", reply);
const cancelled = await c.done;
check(cancelled.at(-1).data.status === "cancelled", "run.finished says cancelled", cancelled.at(-1).data);
check((await record("js-cancel"))?.status === "cancelled", "the record says cancelled");

// 3. Steer: a run with multitask_strategy steer supersedes the running one.
const s1 = followStarted("js-steer", "js-steer-1");
await submit("js-steer", "js-steer-1", "slow count");
await s1.started;
await submit("js-steer", "js-steer-2", "stop, count to three", { multitask_strategy: "steer" });
const steered = (await s1.done).at(-1).data;
check(steered.status === "steered" && steered.superseded_by === "js-steer-2", "the running run ends steered, superseded by the new one", steered);
const s2 = await follow("js-steer", "js-steer-2");
checkSequence("js-steer-2", s2);
check(s2.at(-1).data.status === "success", "the steering run succeeds", s2.at(-1).data);
const r1 = await record("js-steer-1");
check(r1?.status === "steered" && r1.superseded_by === "js-steer-2", "the steered run's record says so", r1);

await svc.stop();
await nc.drain();
console.log(`checks passed: ${passed}`);
