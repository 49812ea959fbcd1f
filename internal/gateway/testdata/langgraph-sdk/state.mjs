// Drives natsagent's gateway with the official LangGraph JS SDK (pinned in
// package.json) and asserts LangGraph's semantics: message shapes, values
// from runs.wait and runs.join, thread state, history order and filters,
// getState at a checkpoint, updateState, forks, interrupts, threads.update
// and threads.copy. Run by TestLangGraphSDK (internal/gateway), which
// starts the gateway and a worker whose model echoes the last message,
// asks "Which city?" for a message containing "ask me", and fails on one
// containing "break". Prints one line per check and "checks passed: N".
import assert from "node:assert/strict";
import { check, client, report } from "./harness.mjs";

const agent = "chatbot";

const human = (content, extra = {}) => ({ type: "human", content, ...extra });
const ids = (history) => history.map((s) => s.checkpoint.checkpoint_id);
const texts = (values) => values.messages.map((m) => `${m.type}:${typeof m.content === "string" ? m.content : JSON.stringify(m.content)}`);

const thread = await client.threads.create({ metadata: { purpose: "sdk" } });
const threadId = thread.thread_id;
let afterFirst; // the state after the first run
let afterSecond;

await check("runs.wait answers the thread's values with LangChain messages", async () => {
  const values = await client.runs.wait(threadId, agent, { input: { messages: [human("hello")] } });
  assert.equal(values.messages.length, 2);
  const [h, ai] = values.messages;
  assert.equal(h.type, "human");
  assert.equal(h.content, "hello");
  assert.equal(typeof h.id, "string");
  assert.equal(h.role, undefined);
  assert.equal(ai.type, "ai");
  assert.equal(ai.content, "echo: hello");
  assert.deepEqual(ai.tool_calls, []);
  assert.equal(typeof ai.response_metadata, "object");
  assert.equal(typeof ai.additional_kwargs, "object");
});

await check("threads.getState has values, next, tasks, checkpoint, parent_checkpoint, metadata, created_at", async () => {
  afterFirst = await client.threads.getState(threadId);
  assert.deepEqual(texts(afterFirst.values), ["human:hello", "ai:echo: hello"]);
  assert.deepEqual(afterFirst.next, []);
  assert.deepEqual(afterFirst.tasks, []);
  assert.equal(afterFirst.checkpoint.thread_id, threadId);
  assert.equal(afterFirst.checkpoint.checkpoint_ns, "");
  assert.equal(typeof afterFirst.checkpoint.checkpoint_id, "string");
  assert.equal(afterFirst.metadata.source, "loop");
  assert.equal(typeof afterFirst.created_at, "string");
  const thread = await client.threads.get(threadId);
  assert.equal(thread.status, "idle");
  assert.deepEqual(texts(thread.values), ["human:hello", "ai:echo: hello"]);
});

await check("runs.create then runs.join answers the values after the run", async () => {
  const run = await client.runs.create(threadId, agent, { input: { messages: [{ role: "user", content: "again" }] } });
  assert.equal(typeof run.run_id, "string");
  const values = await client.runs.join(threadId, run.run_id);
  assert.deepEqual(texts(values), ["human:hello", "ai:echo: hello", "human:again", "ai:echo: again"]);
  afterSecond = await client.threads.getState(threadId);
  assert.equal(afterSecond.values.messages.length, 4);
  assert.equal(afterSecond.metadata.run_id, run.run_id);
});

await check("threads.getHistory: full states, newest first, one chain", async () => {
  const history = await client.threads.getHistory(threadId, { limit: 100 });
  assert.ok(history.length >= 2, `history has ${history.length} entries`);
  assert.equal(history[0].checkpoint.checkpoint_id, afterSecond.checkpoint.checkpoint_id);
  assert.deepEqual(history[0].values, afterSecond.values);
  for (let i = 0; i + 1 < history.length; i++) {
    assert.equal(history[i].parent_checkpoint.checkpoint_id, history[i + 1].checkpoint.checkpoint_id);
    assert.ok(history[i].values.messages.length >= history[i + 1].values.messages.length);
  }
  assert.equal(history[history.length - 1].parent_checkpoint, null);
  assert.ok(ids(history).includes(afterFirst.checkpoint.checkpoint_id));
});

await check("threads.getHistory filters: limit, before, metadata, checkpoint", async () => {
  const all = await client.threads.getHistory(threadId, { limit: 100 });
  const one = await client.threads.getHistory(threadId, { limit: 1 });
  assert.deepEqual(ids(one), ids(all).slice(0, 1));
  const before = await client.threads.getHistory(threadId, { limit: 100, before: all[0].checkpoint });
  assert.deepEqual(ids(before), ids(all).slice(1));
  const firstRun = afterFirst.metadata.run_id;
  const byMeta = await client.threads.getHistory(threadId, { limit: 100, metadata: { run_id: firstRun } });
  assert.ok(byMeta.length > 0 && byMeta.every((s) => s.metadata.run_id === firstRun));
  const byCheckpoint = await client.threads.getHistory(threadId, { limit: 100, checkpoint: { checkpoint_id: afterFirst.checkpoint.checkpoint_id } });
  assert.deepEqual(ids(byCheckpoint), [afterFirst.checkpoint.checkpoint_id]);
});

await check("threads.getState at a checkpoint, by id and by checkpoint object", async () => {
  const byId = await client.threads.getState(threadId, afterFirst.checkpoint.checkpoint_id);
  assert.deepEqual(byId.values, afterFirst.values);
  assert.equal(byId.checkpoint.checkpoint_id, afterFirst.checkpoint.checkpoint_id);
  const byObject = await client.threads.getState(threadId, afterFirst.checkpoint);
  assert.deepEqual(byObject.values, afterFirst.values);
  await assert.rejects(client.threads.getState(threadId, "e999-1"), /404/);
});

let noteCheckpoint;
await check("threads.updateState writes a checkpoint on the head", async () => {
  const res = await client.threads.updateState(threadId, { values: { messages: [human("a note", { id: "note-1" })] }, asNode: "model" });
  noteCheckpoint = res.checkpoint.checkpoint_id;
  assert.equal(typeof noteCheckpoint, "string");
  const state = await client.threads.getState(threadId);
  assert.equal(state.checkpoint.checkpoint_id, noteCheckpoint);
  assert.equal(state.parent_checkpoint.checkpoint_id, afterSecond.checkpoint.checkpoint_id);
  assert.equal(state.metadata.source, "update");
  assert.deepEqual(texts(state.values).slice(-1), ["human:a note"]);
  await assert.rejects(client.threads.updateState(threadId, { values: { approved_tool_calls: ["x"] } }), /400/);
});

await check("threads.updateState on an earlier checkpoint forks; the old branch stays in the history", async () => {
  const res = await client.threads.updateState(threadId, {
    values: { messages: [{ type: "ai", content: "an edited answer" }] },
    checkpointId: afterFirst.checkpoint.checkpoint_id,
  });
  const state = await client.threads.getState(threadId);
  assert.equal(state.checkpoint.checkpoint_id, res.checkpoint.checkpoint_id);
  assert.deepEqual(texts(state.values), ["human:hello", "ai:echo: hello", "ai:an edited answer"]);
  const history = await client.threads.getHistory(threadId, { limit: 100 });
  assert.equal(history[0].checkpoint.checkpoint_id, res.checkpoint.checkpoint_id);
  assert.ok(ids(history).includes(noteCheckpoint), "the branch left behind is in the history");
  const old = await client.threads.getState(threadId, noteCheckpoint);
  assert.equal(old.values.messages.length, 5);
});

await check("runs.wait with checkpointId starts from that checkpoint", async () => {
  const values = await client.runs.wait(threadId, agent, { input: { messages: [human("from the start")] }, checkpointId: afterFirst.checkpoint.checkpoint_id });
  assert.deepEqual(texts(values), ["human:hello", "ai:echo: hello", "human:from the start", "ai:echo: from the start"]);
  const history = await client.threads.getHistory(threadId, { limit: 100 });
  assert.ok(history.some((s) => s.metadata.source === "fork"));
  assert.ok(ids(history).includes(afterSecond.checkpoint.checkpoint_id));
});

await check("an interrupt: __interrupt__ from runs.wait, next and tasks in the state, resume", async () => {
  const t = await client.threads.create();
  const values = await client.runs.wait(t.thread_id, agent, { input: { messages: [human("please ask me something")] } });
  assert.equal(values.__interrupt__.length, 1);
  const intr = values.__interrupt__[0];
  assert.equal(typeof intr.id, "string");
  assert.equal(intr.value.question, "Which city?");
  const state = await client.threads.getState(t.thread_id);
  assert.deepEqual(state.next, ["tools"]);
  assert.equal(state.tasks.length, 1);
  assert.equal(state.tasks[0].interrupts[0].id, intr.id);
  assert.equal((await client.threads.get(t.thread_id)).status, "interrupted");
  const done = await client.runs.wait(t.thread_id, agent, { command: { resume: { answer: "Lyon" } } });
  assert.equal(done.__interrupt__, undefined);
  assert.match(done.messages[done.messages.length - 1].content, /Lyon/);
  assert.deepEqual((await client.threads.getState(t.thread_id)).next, []);
});

await check("runs.wait of a failed run raises the run's error", async () => {
  await assert.rejects(client.runs.wait(null, agent, { input: { messages: [human("break it")] } }), /model is broken/);
});

await check("threads.update merges metadata; threads.copy copies the history", async () => {
  const updated = await client.threads.update(threadId, { metadata: { label: "kept" } });
  assert.equal(updated.metadata.label, "kept");
  assert.equal(updated.metadata.purpose, "sdk");
  const copy = await client.threads.copy(threadId);
  assert.notEqual(copy.thread_id, threadId);
  const [a, b] = await Promise.all([client.threads.getState(threadId), client.threads.getState(copy.thread_id)]);
  assert.deepEqual(b.values, a.values);
  assert.equal(b.checkpoint.thread_id, copy.thread_id);
});

await check("a run cancelled before the model answered keeps its input: getState and getHistory show it, the model next", async () => {
  const t = await client.threads.create();
  const run = await client.runs.create(t.thread_id, agent, { input: { messages: [human("slow: count to a hundred")] } });
  // The first token shows the model is answering: the run took its input.
  for await (const part of client.runs.joinStream(t.thread_id, run.run_id, { streamMode: "messages-tuple" })) {
    if (part.event === "messages") break;
  }
  await client.runs.cancel(t.thread_id, run.run_id, true);
  const state = await client.threads.getState(t.thread_id);
  assert.deepEqual(texts(state.values), ["human:slow: count to a hundred"]);
  assert.deepEqual(state.next, ["model"]);
  assert.equal(state.metadata.run_id, run.run_id);
  const history = await client.threads.getHistory(t.thread_id, { limit: 10 });
  assert.equal(history[0].checkpoint.checkpoint_id, state.checkpoint.checkpoint_id);
  assert.deepEqual(texts(history[0].values), ["human:slow: count to a hundred"]);
  assert.equal(history.at(-1).parent_checkpoint, null);
  assert.deepEqual(history.at(-1).values.messages, []);
});

report();
