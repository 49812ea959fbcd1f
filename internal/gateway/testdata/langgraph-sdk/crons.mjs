// Drives natsagent's crons with the official LangGraph JS SDK: create,
// createForThread, search, count, update, delete, and ticks that start
// runs. Run by TestLangGraphSDKCrons (internal/gateway), whose job runner
// takes the ticks. Prints one line per check and "checks passed: N".
import assert from "node:assert/strict";
import { check, client, report } from "./harness.mjs";

const agent = "chatbot";

const human = (content) => ({ type: "human", content });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const thread = await client.threads.create({ metadata: { purpose: "crons" } });
let stateless;
let onThread;

await check("crons.create answers a stateless cron with its next run date", async () => {
  stateless = await client.crons.create(agent, {
    schedule: "0 9 * * *",
    input: { messages: [human("daily")] },
    metadata: { team: "a" },
    endTime: "2099-01-01T00:00:00Z",
  });
  assert.equal(typeof stateless.cron_id, "string");
  assert.equal(stateless.assistant_id, agent);
  assert.equal(stateless.thread_id, null);
  assert.equal(stateless.schedule, "0 9 * * *");
  assert.equal(stateless.enabled, true);
  assert.equal(stateless.metadata.team, "a");
  assert.deepEqual(stateless.payload.input, { messages: [human("daily")] });
  const next = new Date(stateless.next_run_date);
  assert.equal(next.getUTCHours(), 9);
  assert.ok(next > new Date());
  assert.equal(new Date(stateless.end_time).getUTCFullYear(), 2099);
});

await check("crons.createForThread starts a run on the thread at each tick", async () => {
  onThread = await client.crons.createForThread(thread.thread_id, agent, {
    schedule: "* * * * * *",
    input: { messages: [human("tick")] },
    multitaskStrategy: "enqueue",
  });
  assert.equal(onThread.thread_id, thread.thread_id);
  let runs = [];
  for (let i = 0; i < 300 && runs.length < 2; i++) {
    runs = await client.runs.list(thread.thread_id);
    await sleep(100);
  }
  assert.ok(runs.length >= 2, `runs: ${runs.length}`);
  for (const r of runs) assert.equal(r.metadata.cron_id, onThread.cron_id);
});

await check("crons.search filters by thread, metadata and enabled; crons.count counts", async () => {
  const all = await client.crons.search({});
  assert.deepEqual(all.map((c) => c.cron_id).sort(), [stateless.cron_id, onThread.cron_id].sort());
  const byThread = await client.crons.search({ threadId: thread.thread_id });
  assert.deepEqual(byThread.map((c) => c.cron_id), [onThread.cron_id]);
  const byMeta = await client.crons.search({ metadata: { team: "a" } });
  assert.deepEqual(byMeta.map((c) => c.cron_id), [stateless.cron_id]);
  const sorted = await client.crons.search({ sortBy: "created_at", sortOrder: "asc", limit: 1 });
  assert.equal(sorted[0].cron_id, stateless.cron_id);
  assert.equal(await client.crons.count({}), 2);
  assert.equal(await client.crons.count({ assistantId: agent, threadId: thread.thread_id }), 1);
  assert.equal(await client.crons.count({ metadata: { team: "b" } }), 0);
});

await check("crons.update changes the schedule and disables a cron", async () => {
  const updated = await client.crons.update(stateless.cron_id, { schedule: "30 10 * * 1", timezone: "Europe/Paris", endTime: null });
  assert.equal(updated.schedule, "30 10 * * 1");
  assert.equal(updated.timezone, "Europe/Paris");
  assert.equal(updated.end_time, null);
  const off = await client.crons.update(stateless.cron_id, { enabled: false });
  assert.equal(off.enabled, false);
  assert.equal(off.next_run_date, null);
  assert.equal((await client.crons.search({ enabled: false }))[0].cron_id, stateless.cron_id);
});

await check("crons.delete stops a cron", async () => {
  await client.crons.delete(onThread.cron_id);
  await client.crons.delete(stateless.cron_id);
  assert.equal(await client.crons.count({}), 0);
  // A tick fired before the delete may still land; a cron that goes on
  // (every second) never lets the count settle for 3 seconds.
  let before = -1;
  let settled = false;
  for (let i = 0; i < 8 && !settled; i++) {
    const now = (await client.runs.list(thread.thread_id, { limit: 1000 })).length;
    settled = now === before;
    before = now;
    if (!settled) await sleep(3000);
  }
  assert.ok(settled, "runs kept coming after the cron was deleted");
  await assert.rejects(client.crons.delete(onThread.cron_id), /404|not found/i);
});

report();
