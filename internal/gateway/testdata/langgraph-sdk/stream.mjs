// Drives natsagent's gateway's stream modes with the official LangGraph JS
// SDK (runs.stream, runs.joinStream) and asserts LangGraph's semantics per
// mode: event names, payload shapes, values holding the final AI message,
// message chunks concatenating to it, interrupts, errors. Run by
// TestLangGraphSDKStream (internal/gateway) against a worker whose model
// echoes the last message, asks "Which city?" for a message containing
// "ask me", and fails on one containing "break". Prints one line per check
// and "checks passed: N".
import assert from "node:assert/strict";
import { check, client, report } from "./harness.mjs";

const agent = "chatbot";

const human = (content) => ({ type: "human", content });

// stream runs a new run on a new thread and collects its parts.
async function stream(text, payload = {}) {
  const thread = await client.threads.create();
  const parts = [];
  for await (const part of client.runs.stream(thread.thread_id, agent, { input: { messages: [human(text)] }, ...payload })) {
    parts.push(part);
  }
  return { threadId: thread.thread_id, parts };
}

const named = (parts, event) => parts.filter((p) => p.event === event);
const lastAI = (values) => values.messages.filter((m) => m.type === "ai").at(-1);

await check("no streamMode: metadata, then values (LangGraph's default), then end", async () => {
  const { threadId, parts } = await stream("plain");
  assert.equal(parts[0].event, "metadata");
  assert.equal(parts[0].data.thread_id, threadId);
  assert.equal(typeof parts[0].data.run_id, "string");
  assert.equal(parts[0].data.attempt, 1);
  assert.equal(parts.at(-1).event, "end");
  for (const p of parts.slice(1, -1)) assert.equal(p.event, "values");
});

await check("values: the input first, the final AI message last, as the thread's state", async () => {
  const { threadId, parts } = await stream("values please", { streamMode: "values" });
  const values = named(parts, "values").map((p) => p.data);
  assert.ok(values.length >= 2);
  assert.deepEqual(values[0].messages.map((m) => [m.type, m.content]), [["human", "values please"]]);
  const state = await client.threads.getState(threadId);
  assert.deepEqual(values.at(-1).messages, state.values.messages);
  assert.equal(lastAI(values.at(-1)).content, "echo: values please");
});

await check("messages-tuple: [AIMessageChunk, metadata] chunks concatenate to the completed message, under its id", async () => {
  const { threadId, parts } = await stream("tuple me", { streamMode: "messages-tuple" });
  const tuples = named(parts, "messages");
  assert.ok(tuples.length >= 1);
  const state = await client.threads.getState(threadId);
  const ai = lastAI(state.values);
  let text = "";
  for (const { data } of tuples) {
    assert.ok(Array.isArray(data) && data.length === 2);
    const [chunk, meta] = data;
    assert.equal(chunk.type, "AIMessageChunk");
    assert.equal(chunk.id, ai.id);
    assert.equal(meta.langgraph_node, "model");
    assert.equal(meta.thread_id, threadId);
    assert.ok(Array.isArray(meta.tags));
    text += chunk.content;
  }
  assert.equal(text, ai.content);
  assert.equal(named(parts, "values").length, 0);
});

await check("updates: {model: {messages: [the AI message]}} per step", async () => {
  const { threadId, parts } = await stream("update me", { streamMode: "updates" });
  const updates = named(parts, "updates").map((p) => p.data);
  const model = updates.filter((u) => "model" in u);
  assert.equal(model.length, 1);
  const state = await client.threads.getState(threadId);
  const msg = model[0].model.messages[0];
  assert.equal(msg.type, "ai");
  assert.equal(msg.id, lastAI(state.values).id);
  assert.equal(msg.content, "echo: update me");
});

await check("custom: only custom parts (none for a plain run) between metadata and end", async () => {
  const { parts } = await stream("custom", { streamMode: "custom" });
  assert.deepEqual(parts.map((p) => p.event).filter((e) => e !== "custom"), ["metadata", "end"]);
});

await check("a list of modes streams each mode's parts", async () => {
  const { parts } = await stream("all of them", { streamMode: ["values", "messages-tuple", "updates"] });
  const events = new Set(parts.map((p) => p.event));
  for (const e of ["metadata", "values", "messages", "updates", "end"]) assert.ok(events.has(e), `no ${e} in ${[...events]}`);
  assert.equal(events.size, 5);
});

await check("error: a failed run ends with error {error, message}", async () => {
  const { parts } = await stream("break please", { streamMode: ["values"] });
  const err = named(parts, "error");
  assert.equal(err.length, 1);
  assert.equal(err[0].data.error, "RunError");
  assert.match(err[0].data.message, /broken/);
});

await check("an interrupt shows __interrupt__ in values and updates", async () => {
  const { parts } = await stream("ask me something", { streamMode: ["values", "updates"] });
  const last = named(parts, "values").at(-1).data;
  assert.deepEqual(Object.keys(last), ["__interrupt__"]);
  assert.equal(last.__interrupt__[0].value.question, "Which city?");
  assert.equal(typeof last.__interrupt__[0].id, "string");
  assert.ok("__interrupt__" in named(parts, "updates").at(-1).data);
});

await check("joinStream with lastEventId resumes after that event in the mode asked", async () => {
  let runId;
  const thread = await client.threads.create();
  const first = [];
  for await (const part of client.runs.stream(thread.thread_id, agent, {
    input: { messages: [human("join me")] },
    streamMode: "values",
    onRunCreated: (meta) => { runId = meta.run_id; },
  })) {
    first.push(part);
  }
  const k = first.findIndex((p) => p.event === "values" && p.id);
  assert.ok(k > 0);
  const rest = [];
  for await (const part of client.runs.joinStream(thread.thread_id, runId, { lastEventId: first[k].id, streamMode: "values" })) {
    rest.push(part);
  }
  // What followed the input's values: values with the answer (a live
  // title may add one to a replay), and the end; no metadata again.
  assert.equal(rest.at(-1).event, "end");
  assert.ok(rest.slice(0, -1).every((p) => p.event === "values" && p.data.messages.length === 2), rest.map((p) => p.event));
  assert.deepEqual(named(rest, "values").at(-1).data, named(first, "values").at(-1).data);
});

await check("joinStream without streamMode streams values for runs.create, the run's own modes for runs.stream", async () => {
  const thread = await client.threads.create();
  const run = await client.runs.create(thread.thread_id, agent, { input: { messages: [human("join plain")] } });
  const parts = [];
  for await (const part of client.runs.joinStream(thread.thread_id, run.run_id)) parts.push(part);
  assert.equal(parts[0].event, "metadata");
  assert.equal(parts.at(-1).event, "end");
  assert.ok(parts.slice(1, -1).every((p) => p.event === "values"), parts.map((p) => p.event));
  const last = named(parts, "values").at(-1).data;
  assert.deepEqual(last.messages.map((m) => `${m.type}:${m.content}`), ["human:join plain", "ai:echo: join plain"]);

  let runId;
  for await (const _ of client.runs.stream(thread.thread_id, agent, {
    input: { messages: [human("join tuples")] },
    streamMode: ["messages-tuple", "updates"],
    onRunCreated: (meta) => { runId = meta.run_id; },
  })) { /* drained */ }
  const again = [];
  for await (const part of client.runs.joinStream(thread.thread_id, runId)) again.push(part);
  const events = new Set(again.map((p) => p.event));
  assert.ok(events.has("messages") && events.has("updates") && !events.has("values"), [...events]);
  const text = named(again, "messages").map((p) => p.data[0].content).join("");
  assert.equal(text, "echo: join tuples");
  assert.deepEqual(Object.keys(named(again, "updates")[0].data), ["model"]);
});

await check("natsagent mode streams natsagent's own events", async () => {
  const { parts } = await stream("native", { streamMode: "natsagent" });
  assert.equal(parts[0].event, "run.queued");
  assert.equal(parts.at(-1).event, "run.finished");
  assert.equal(parts.at(-1).data.data.status, "success");
});

await check("messages (deprecated): messages/metadata, messages/partial growing, messages/complete", async () => {
  const { threadId, parts } = await stream("old style", { streamMode: "messages" });
  const ai = lastAI((await client.threads.getState(threadId)).values);
  const mine = parts.filter((p) => p.event.startsWith("messages/"));
  assert.equal(mine[0].event, "messages/metadata");
  assert.equal(typeof mine[0].data[ai.id].metadata, "object");
  const partial = named(parts, "messages/partial").map((p) => p.data[0].content);
  for (let i = 1; i < partial.length; i++) assert.ok(partial[i].startsWith(partial[i - 1]));
  const complete = named(parts, "messages/complete").at(-1).data[0];
  assert.equal(complete.id, ai.id);
  assert.equal(complete.content, ai.content);
});

await check("events: on_chat_model_stream chunks make the answer; on_chain_end has the final values", async () => {
  const { threadId, parts } = await stream("eventful", { streamMode: "events" });
  const state = await client.threads.getState(threadId);
  const evs = named(parts, "events").map((p) => p.data);
  assert.equal(evs[0].event, "on_chat_model_start");
  const text = evs.filter((e) => e.event === "on_chat_model_stream").map((e) => e.data.chunk.content).join("");
  assert.equal(text, lastAI(state.values).content);
  assert.equal(evs.filter((e) => e.event === "on_chat_model_end")[0].data.output.content, lastAI(state.values).content);
  const end = evs.at(-1);
  assert.equal(end.event, "on_chain_end");
  assert.deepEqual(end.data.output.messages, state.values.messages);
});

await check("tasks: a tool call's task starts and the model's task has its result", async () => {
  const { parts } = await stream("ask me a task", { streamMode: "tasks" });
  const tasks = named(parts, "tasks").map((p) => p.data);
  const model = tasks.find((t) => t.name === "model" && "result" in t);
  assert.equal(model.result[0][0], "messages");
  assert.equal(model.result[0][1][0].tool_calls[0].name, "ask_clarification");
  const tool = tasks.find((t) => t.name === "tools" && "input" in t);
  assert.equal(tool.input.tool_call.name, "ask_clarification");
  assert.deepEqual(tool.interrupts, []);
});

await check("checkpoints: after each step, with values, next and a checkpoint", async () => {
  const { threadId, parts } = await stream("checkpoint me", { streamMode: "checkpoints" });
  const cps = named(parts, "checkpoints").map((p) => p.data);
  assert.ok(cps.length >= 1);
  const last = cps.at(-1);
  assert.equal(last.config.configurable.thread_id, threadId);
  assert.equal(typeof last.checkpoint.checkpoint_id, "string");
  assert.deepEqual(last.next, []);
  assert.equal(lastAI(last.values).content, "echo: checkpoint me");
});

await check("debug: task_result and checkpoint entries with step and payload", async () => {
  const { parts } = await stream("debug me", { streamMode: "debug" });
  const types = named(parts, "debug").map((p) => p.data.type);
  assert.deepEqual(types, ["task_result", "checkpoint"]);
  for (const p of named(parts, "debug")) {
    assert.equal(typeof p.data.step, "number");
    assert.equal(typeof p.data.timestamp, "string");
    assert.equal(typeof p.data.payload, "object");
  }
});

await check("streamSubgraphs: a subagent run's parts come as <mode>|tools:<tool_call_id>", async () => {
  const { parts } = await stream("spawn a child", { streamMode: ["values", "messages-tuple"], streamSubgraphs: true });
  const child = parts.filter((p) => p.event.includes("|"));
  assert.ok(child.length > 0, `no namespaced parts in ${parts.map((p) => p.event)}`);
  for (const p of child) {
    const [mode, ...ns] = p.event.split("|");
    assert.ok(mode === "values" || mode === "messages", p.event);
    assert.deepEqual(ns, ["tools:call_spawn"]);
  }
  const values = child.filter((p) => p.event.startsWith("values|")).at(-1).data;
  assert.deepEqual(values.messages.map((m) => [m.type, m.content]), [["human", "child work"], ["ai", "echo: child work"]]);
  const lead = named(parts, "values").at(-1).data;
  assert.equal(lead.messages.at(-1).content, "got: child answer");
  assert.equal(parts.at(-1).event, "end");
});

await check("tools and lifecycle: on_tool_start/on_tool_end, and lifecycle|tools:<id> started and completed", async () => {
  const { parts } = await stream("spawn a child", { streamMode: ["tools", "lifecycle"] });
  const tools = named(parts, "tools").map((p) => p.data);
  assert.deepEqual(tools.map((t) => [t.event, t.name, t.toolCallId]), [["on_tool_start", "spawn", "call_spawn"], ["on_tool_end", "spawn", "call_spawn"]]);
  assert.equal(tools[1].output, "child answer");
  const life = named(parts, "lifecycle|tools:call_spawn").map((p) => p.data);
  assert.deepEqual(life.map((l) => l.event), ["started", "completed"]);
  assert.deepEqual(life[0].namespace, ["tools:call_spawn"]);
  assert.equal(life[0].tool_call_id, "call_spawn");
});

report();
