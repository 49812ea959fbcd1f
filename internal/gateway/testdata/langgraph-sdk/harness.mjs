// What every SDK script here shares: the client of the gateway the Go
// test started (LANGGRAPH_URL), check (one named check, its outcome
// printed on one line) and report (the "checks passed: N" line the Go test
// reads, and a failing exit when any check failed).
import { Client } from "@langchain/langgraph-sdk";

const apiUrl = process.env.LANGGRAPH_URL;
if (!apiUrl) {
  console.error("LANGGRAPH_URL is not set");
  process.exit(2);
}
export const client = new Client({ apiUrl, callerOptions: { maxRetries: 0 } });

let passed = 0;
let failed = 0;

export async function check(name, fn) {
  try {
    await fn();
    passed++;
    console.log(`ok   ${name}`);
  } catch (err) {
    failed++;
    console.log(`FAIL ${name}: ${err && err.stack ? err.stack : err}`);
  }
}

export function report() {
  console.log(`checks passed: ${passed}`);
  if (failed > 0) {
    console.log(`checks failed: ${failed}`);
    process.exit(1);
  }
}
