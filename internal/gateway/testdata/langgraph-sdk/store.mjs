// Drives natsagent's gateway with the official LangGraph JS SDK: the
// store client (putItem, getItem, deleteItem, searchItems,
// listNamespaces), as alice and bob of one tenant (ALICE_KEY, BOB_KEY) and
// carol of another (CAROL_KEY). Run by TestLangGraphSDKStore
// (internal/gateway), whose gateway ranks queries with the test server's
// embeddings and has written alice's memory notes. Prints "checks
// passed: N".
import assert from "node:assert/strict";
import { Client } from "@langchain/langgraph-sdk";
import { check, report } from "./harness.mjs";

const as = (apiKey) => new Client({ apiUrl: process.env.LANGGRAPH_URL, apiKey, callerOptions: { maxRetries: 0 } });
const alice = as(process.env.ALICE_KEY);
const bob = as(process.env.BOB_KEY);
const carol = as(process.env.CAROL_KEY);

await check("putItem then getItem returns LangGraph's item", async () => {
  await alice.store.putItem(["team", "docs"], "plan", { title: "Launch plan", owner: "alice" });
  const item = await alice.store.getItem(["team", "docs"], "plan");
  assert.deepEqual(item.namespace, ["team", "docs"]);
  assert.equal(item.key, "plan");
  assert.deepEqual(item.value, { title: "Launch plan", owner: "alice" });
  assert.ok(!Number.isNaN(Date.parse(item.createdAt)));
  assert.ok(!Number.isNaN(Date.parse(item.updatedAt)));
  assert.equal(item.created_at, item.createdAt);
});

await check("getItem of a missing item is null; another tenant sees nothing", async () => {
  assert.equal(await alice.store.getItem(["team", "docs"], "nothing"), null);
  assert.equal(await carol.store.getItem(["team", "docs"], "plan"), null);
  assert.deepEqual((await carol.store.searchItems([])).items, []);
});

await check("the tenant's shared namespaces are shared: bob reads and updates alice's item", async () => {
  const item = await bob.store.getItem(["team", "docs"], "plan");
  assert.equal(item.value.title, "Launch plan");
  await bob.store.putItem(["team", "docs"], "plan", { title: "Launch plan v2", owner: "bob" }, { ttl: 60, index: false });
  const again = await alice.store.getItem(["team", "docs"], "plan", { refreshTtl: true });
  assert.equal(again.value.title, "Launch plan v2");
  assert.equal(again.createdAt, item.createdAt);
});

await check("searchItems filters, pages and ranks a query by meaning", async () => {
  const facts = { pets: "two cats and a dog", food: "spicy food and pizza", job: "works nights as a nurse" };
  for (const [key, text] of Object.entries(facts)) {
    await alice.store.putItem(["users", "alice", "facts"], key, { text, kind: key === "job" ? "work" : "life" }, { index: ["text"] });
  }
  const ranked = await alice.store.searchItems(["users", "alice"], { query: "does she like pizza", limit: 2 });
  assert.equal(ranked.items.length, 2);
  assert.equal(ranked.items[0].key, "food");
  assert.ok(ranked.items[0].score > ranked.items[1].score);
  const filtered = await alice.store.searchItems(["users", "alice"], { filter: { kind: "work" } });
  assert.deepEqual(filtered.items.map((i) => i.key), ["job"]);
  const page = await alice.store.searchItems(["users", "alice", "facts"], { limit: 1, offset: 1 });
  assert.equal(page.items.length, 1);
});

await check("listNamespaces with prefix and maxDepth", async () => {
  const all = await alice.store.listNamespaces();
  assert.ok(all.namespaces.some((ns) => ns.join("/") === "users/alice/facts"));
  const top = await alice.store.listNamespaces({ maxDepth: 1 });
  assert.deepEqual(top.namespaces.map((ns) => ns.join("/")).sort(), ["memories", "team", "users"]);
  const team = await alice.store.listNamespaces({ prefix: ["team"] });
  assert.deepEqual(team.namespaces, [["team", "docs"]]);
});

await check("another user's namespaces are refused (403) and left out of bob's searches", async () => {
  await assert.rejects(bob.store.getItem(["users", "alice", "facts"], "food"), /403|belongs to user alice/);
  await assert.rejects(bob.store.putItem(["memories", "alice"], "notes", { content: "- hacked" }), /403|belongs to user alice/);
  await assert.rejects(bob.store.searchItems(["users", "alice"]), /403|belongs to user alice/);
  const seen = await bob.store.searchItems([], { limit: 100 });
  assert.ok(seen.items.every((i) => i.namespace[1] !== "alice"), JSON.stringify(seen.items));
  const nss = await bob.store.listNamespaces();
  assert.ok(nss.namespaces.every((ns) => ns[1] !== "alice"), JSON.stringify(nss.namespaces));
});

await check("alice's memory notes are a store item she edits", async () => {
  const notes = await alice.store.getItem(["memories", "alice"], "notes");
  assert.match(notes.value.content, /Lives in Lyon/);
  await alice.store.putItem(["memories", "alice"], "notes", { content: "- Lives in Paris" });
});

await check("deleteItem removes the item", async () => {
  await alice.store.deleteItem(["team", "docs"], "plan");
  assert.equal(await alice.store.getItem(["team", "docs"], "plan"), null);
  assert.deepEqual((await alice.store.searchItems(["team"])).items, []);
});

report();
