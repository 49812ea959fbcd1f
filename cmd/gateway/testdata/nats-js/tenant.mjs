// Tenant isolation as the official NATS JavaScript client v3 sees it, on a
// nats-server with the shipped deploy/nats/tenants.conf (deploy's
// TestJSClientTenantRefused runs it, with NATS_URL, NATS_USER and
// NATS_PASSWORD of tenant acme's user): the server refuses acme's client
// globex's subjects, and the client reports a permission violation naming
// the subject, while acme's own subjects stay open. Every check prints
// "ok: ..."; the first failure exits 1; the last line is
// "checks passed: N".
import { connect, PermissionViolationError } from "@nats-io/transport-node";

let passed = 0;

function check(ok, what, got) {
  if (!ok) {
    console.log(`FAIL: ${what}` + (got === undefined ? "" : `: got ${got}`));
    process.exit(1);
  }
  passed++;
  console.log(`ok: ${what}`);
}

const nc = await connect({ servers: process.env.NATS_URL, user: process.env.NATS_USER, pass: process.env.NATS_PASSWORD });
// The violations the server reports on the connection, as they come.
const violations = [];
(async () => {
  for await (const s of nc.status()) {
    if (s.type === "error" && s.error instanceof PermissionViolationError) violations.push(s.error);
  }
})();

function refused(operation, subject) {
  return violations.some((e) => e.operation === operation && e.subject === subject);
}

async function waitFor(cond) {
  for (let i = 0; i < 100 && !cond(); i++) {
    await nc.flush();
    await new Promise((r) => setTimeout(r, 50));
  }
  return cond();
}

// Subscriptions: globex's events are refused and the subscription closes
// with the violation; acme's stay open.
const own = nc.subscribe("agent.events.acme.>");
const other = nc.subscribe("agent.events.globex.>");
const closed = await other.closed;
check(closed instanceof PermissionViolationError && closed.operation === "subscription" && closed.subject === "agent.events.globex.>",
  "a subscription to globex's events closes with a permission violation", closed);
for (const subject of ["agent.live.globex.>", "agent.>", "agent.tools.globex.shout"]) {
  const s = nc.subscribe(subject);
  const err = await s.closed;
  check(err instanceof PermissionViolationError && err.subject === subject, `subscribing to ${subject} is refused`, err);
}

// Publishes: a run request on globex's subject is refused, and so is a
// cancel of a globex run.
// Acme's own run request goes first: the server answers in order, so its
// refusal, were there one, would come before globex's.
const req = (run, thread) => JSON.stringify({ run_id: run, thread_id: thread, input: { messages: [{ role: "user", content: "hi" }] } });
nc.publish("agent.runs.acme.at", req("a-js", "at"));
nc.publish("agent.runs.globex.gt", req("x-js", "gt"));
check(await waitFor(() => refused("publish", "agent.runs.globex.gt")),
  "publishing a run request to agent.runs.globex.gt is refused", JSON.stringify(violations));
let cancelErr;
try {
  await nc.request("agent.ctl.globex.gt.x-js.cancel", "", { timeout: 2000 });
} catch (e) {
  cancelErr = e;
}
// The client fails the request with the server's refusal as its cause.
const cause = cancelErr?.cause;
check(cause instanceof PermissionViolationError && cause.operation === "publish" && cause.subject === "agent.ctl.globex.gt.x-js.cancel",
  "a cancel request to globex's run fails with a permission violation", cancelErr);

// Acme's own subscription outlived the refusals.
check(!own.isClosed(), "acme's own events subscription is still open");
check(!refused("subscription", "agent.events.acme.>") && !refused("publish", "agent.runs.acme.at"), "nothing of acme's own was refused");

await nc.close();
console.log(`checks passed: ${passed}`);
