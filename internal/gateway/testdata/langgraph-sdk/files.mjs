// Drives natsagent's gateway with the official LangGraph JS SDK and checks
// that a thread's workdir follows its branches (protocol.md 3.3): a run
// forked with checkpointId sees the files of that checkpoint, the old
// branch keeps its own (read with ?checkpoint_id=), and a run cancelled
// with action "rollback" takes its files with it. Run by
// TestLangGraphSDKFiles, whose model writes files for "write one" and
// "write two", reads /a.txt for "read", and for "slow" writes and then
// waits for the run's end. Prints one line per check and "checks passed: N".
import assert from "node:assert/strict";
import { check, client, report } from "./harness.mjs";

const agent = "chatbot";
const apiUrl = process.env.LANGGRAPH_URL;
const trusted = { configurable: { tool_approval_mode: "always_trust" } };
const say = (content) => ({ input: { messages: [{ type: "human", content }] }, config: trusted });

// files reads the workdir through the gateway's file routes (the SDK has
// none): path → content, at a checkpoint when one is named.
async function files(threadId, checkpointId) {
  const q = checkpointId ? `?checkpoint_id=${encodeURIComponent(checkpointId)}` : "";
  const list = await (await fetch(`${apiUrl}/threads/${threadId}/files${q}`)).json();
  const out = {};
  for (const f of list) {
    out[f.path] = await (await fetch(`${apiUrl}/threads/${threadId}/files${f.path}${q}`)).text();
  }
  return out;
}

const thread = await client.threads.create();
const threadId = thread.thread_id;
let first;
let second;

await check("runs.wait: each run's files are recorded at its checkpoint", async () => {
  await client.runs.wait(threadId, agent, say("write one"));
  first = await client.threads.getState(threadId);
  await client.runs.wait(threadId, agent, say("write two"));
  second = await client.threads.getState(threadId);
  assert.deepEqual(await files(threadId), { "/a.txt": "two", "/b.txt": "bee" });
  assert.deepEqual(await files(threadId, first.checkpoint.checkpoint_id), { "/a.txt": "one" });
});

await check("runs.wait with checkpointId: the fork sees that checkpoint's files; the old branch keeps its own", async () => {
  const values = await client.runs.wait(threadId, agent, { ...say("read"), checkpointId: first.checkpoint.checkpoint_id });
  const tool = values.messages.findLast((m) => m.type === "tool" && m.name === "read_file");
  assert.ok(tool && tool.content.includes("one") && !tool.content.includes("two"), JSON.stringify(tool));
  assert.deepEqual(await files(threadId), { "/a.txt": "one" });
  assert.deepEqual(await files(threadId, second.checkpoint.checkpoint_id), { "/a.txt": "two", "/b.txt": "bee" });
});

await check("threads.updateState on the old branch checks its files out", async () => {
  await client.threads.updateState(threadId, { values: null, checkpointId: second.checkpoint.checkpoint_id });
  assert.deepEqual(await files(threadId), { "/a.txt": "two", "/b.txt": "bee" });
});

await check("runs.cancel with action rollback takes the run's files back", async () => {
  const run = await client.runs.create(threadId, agent, say("slow"));
  const deadline = Date.now() + 60_000;
  while (JSON.stringify(await files(threadId)) !== JSON.stringify({ "/a.txt": "slow", "/b.txt": "bee", "/c.txt": "sea" })) {
    assert.ok(Date.now() < deadline, "the slow run never wrote its files");
    await new Promise((r) => setTimeout(r, 100));
  }
  await client.runs.cancel(threadId, run.run_id, true, "rollback");
  assert.deepEqual(await files(threadId), { "/a.txt": "two", "/b.txt": "bee" });
});

report();
