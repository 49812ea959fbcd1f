// Drives natsagent's gateway with the official LangGraph JS SDK: the
// assistants client (search, get, create, update, delete, getVersions,
// setLatest, getSchemas, getGraph, getSubgraphs, count) and
// threads.search/count, as Agent Chat UI starts. Run by
// TestLangGraphSDKAssistants (internal/gateway), whose model answers with
// the model name each run asked for. Prints "checks passed: N".
import assert from "node:assert/strict";
import { check, client, report } from "./harness.mjs";

let created;

await check("assistants.search lists the graphs as system assistants", async () => {
  const found = await client.assistants.search({ graphId: "chatbot" });
  assert.equal(found.length, 1);
  assert.equal(found[0].graph_id, "chatbot");
  assert.equal(found[0].metadata.created_by, "system");
  assert.match(found[0].assistant_id, /^[0-9a-f-]{36}$/);
  const paged = await client.assistants.search({ limit: 1, includePagination: true });
  assert.equal(paged.assistants.length, 1);
});

await check("assistants.create, get and count", async () => {
  created = await client.assistants.create({ graphId: "chatbot", name: "Terse", context: { model: "assistant-model" }, metadata: { team: "sdk" } });
  assert.equal(created.graph_id, "chatbot");
  assert.equal(created.version, 1);
  assert.deepEqual(created.context, { model: "assistant-model" });
  const got = await client.assistants.get(created.assistant_id);
  assert.equal(got.name, "Terse");
  assert.equal(await client.assistants.count({ metadata: { team: "sdk" } }), 1);
});

await check("assistants.create refuses a setting a run may not set, naming it", async () => {
  await assert.rejects(client.assistants.create({ graphId: "chatbot", config: { configurable: { system_prompt: "x" } } }), /system_prompt/);
});

await check("assistants.update makes a version; getVersions lists them; setLatest goes back", async () => {
  const v2 = await client.assistants.update(created.assistant_id, { name: "Terser", metadata: { tier: "2" } });
  assert.equal(v2.version, 2);
  assert.equal(v2.metadata.team, "sdk");
  const versions = await client.assistants.getVersions(created.assistant_id);
  assert.deepEqual(versions.map((v) => v.version), [2, 1]);
  const back = await client.assistants.setLatest(created.assistant_id, 1);
  assert.equal(back.version, 1);
  assert.equal((await client.assistants.get(created.assistant_id)).name, "Terse");
});

await check("assistants.getSchemas and getGraph describe the graph", async () => {
  const schemas = await client.assistants.getSchemas(created.assistant_id);
  assert.equal(schemas.graph_id, "chatbot");
  assert.ok(schemas.input_schema.properties.messages);
  assert.ok(schemas.context_schema.properties.model);
  const graph = await client.assistants.getGraph(created.assistant_id);
  assert.deepEqual(graph.nodes.map((n) => n.id), ["__start__", "model", "tools", "__end__"]);
  assert.deepEqual(await client.assistants.getSubgraphs(created.assistant_id), {});
});

let threadId;
await check("a run with the created assistant_id runs with its config", async () => {
  const thread = await client.threads.create({ metadata: { app: "sdk-assistants" } });
  threadId = thread.thread_id;
  const values = await client.runs.wait(threadId, created.assistant_id, { input: { messages: [{ type: "human", content: "which model?" }] } });
  assert.equal(values.messages.at(-1).content, "model: assistant-model");
  const own = await client.runs.wait(threadId, created.assistant_id, { input: { messages: [{ type: "human", content: "and now?" }] }, config: { configurable: { model: "run-model" } } });
  assert.equal(own.messages.at(-1).content, "model: run-model");
});

await check("threads.search finds the thread by metadata, newest first; threads.count counts", async () => {
  const other = await client.threads.create({ metadata: { app: "sdk-assistants", n: 2 } });
  const found = await client.threads.search({ metadata: { app: "sdk-assistants" }, limit: 10 });
  assert.deepEqual(found.map((t) => t.thread_id), [other.thread_id, threadId]);
  // Oldest updated first, with no filter: read from the stream's start.
  const oldest = await client.threads.search({ sortBy: "updated_at", sortOrder: "asc", limit: 10 });
  assert.deepEqual(oldest.map((t) => t.thread_id), [threadId, other.thread_id]);
  const byIds = await client.threads.search({ ids: [threadId], status: "idle" });
  assert.equal(byIds.length, 1);
  const sel = await client.threads.search({ metadata: { n: 2 }, select: ["thread_id"] });
  assert.deepEqual(sel, [{ thread_id: other.thread_id }]);
  assert.equal(await client.threads.count({ metadata: { app: "sdk-assistants" } }), 2);
  assert.equal(await client.threads.count({ status: "idle" }), 2);
  await assert.rejects(client.threads.search({ values: { messages: [] } }), /values/);
});

await check("threads.search returns each thread's values unless select leaves them out", async () => {
  const found = await client.threads.search({ metadata: { app: "sdk-assistants" }, limit: 10 });
  assert.deepEqual(found[1].values.messages.map((m) => m.content), ["which model?", "model: assistant-model", "and now?", "model: run-model"]);
  assert.deepEqual(found[0].values.messages, []);
  const sorted = await client.threads.search({ metadata: { app: "sdk-assistants" }, sortBy: "created_at", sortOrder: "asc", select: ["thread_id", "values"] });
  assert.deepEqual(sorted.map((t) => t.thread_id), [threadId, found[0].thread_id]);
  assert.equal(sorted[0].values.messages.length, 4);
  assert.deepEqual(Object.keys(sorted[0]).sort(), ["thread_id", "values"]);
  const bare = await client.threads.search({ metadata: { app: "sdk-assistants" }, select: ["thread_id", "status"] });
  assert.ok(bare.every((t) => !("values" in t)));
});

await check("assistants.delete removes it", async () => {
  await client.assistants.delete(created.assistant_id);
  await assert.rejects(client.assistants.get(created.assistant_id), /404|not found/i);
  assert.equal(await client.assistants.count({ metadata: { team: "sdk" } }), 0);
});

report();
