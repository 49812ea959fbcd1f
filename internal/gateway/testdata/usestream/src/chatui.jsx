// What Agent Chat UI (langchain-ai/agent-chat-ui) does at start-up, with
// the official SDK: it asks GET /info whether the server is up
// (checkGraphStatus: any answer but 200 shows an error), searches the
// assistants (the graph picker), lists
// the history of the chosen graph with threads.search filtered on the
// thread metadata graph_id (an assistant id filters on assistant_id) and
// limit 100, opens a thread with useStream and fetchStateHistory (the
// thread's history), and submits a message on it or on a new thread,
// after which it lists the history again. internal/gateway's
// TestAgentChatUIStartInBrowser drives it in headless Chromium; the DOM
// ids and classes are what the test reads.
import { useCallback, useEffect, useState } from "react";
import { createRoot } from "react-dom/client";
import { Client } from "@langchain/langgraph-sdk";
import { useStream } from "@langchain/langgraph-sdk/react";

const apiUrl = window.location.origin;
const client = new Client({ apiUrl });
const uuid = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

function textOf(m) {
  if (typeof m.content === "string") return m.content;
  if (Array.isArray(m.content)) {
    return m.content.filter((b) => b && b.type === "text").map((b) => b.text).join("");
  }
  return "";
}

// The sidebar's title of a thread, as Agent Chat UI's ThreadHistory
// makes it: the first message of its values, else its id.
function titleOf(t) {
  const first = t.values?.messages?.[0];
  return first ? textOf(first) : t.thread_id;
}

function App() {
  const params = new URLSearchParams(window.location.search);
  const assistantId = params.get("assistantId") ?? "chatbot";
  const [assistants, setAssistants] = useState(null);
  const [threads, setThreads] = useState(null);
  const [threadId, setThreadId] = useState(params.get("threadId"));
  const [error, setError] = useState("");
  const [draft, setDraft] = useState("");
  const [server, setServer] = useState("checking");

  const getThreads = useCallback(async () => {
    const metadata = uuid.test(assistantId) ? { assistant_id: assistantId } : { graph_id: assistantId };
    return client.threads.search({ metadata, limit: 100 });
  }, [assistantId]);

  useEffect(() => {
    fetch(`${apiUrl}/info`).then((res) => setServer(res.ok ? "ok" : `down ${res.status}`), (e) => setServer(`down ${e}`));
  }, []);

  useEffect(() => {
    client.assistants.search({ limit: 100 }).then(setAssistants, (e) => setError(String(e)));
    getThreads().then(setThreads, (e) => setError(String(e)));
  }, [getThreads]);

  const stream = useStream({
    apiUrl,
    assistantId,
    threadId,
    fetchStateHistory: true,
    onThreadId: (id) => {
      setThreadId(id);
      // Agent Chat UI lists the history again once a new thread exists.
      getThreads().then(setThreads, (e) => setError(String(e)));
    },
    onFinish: () => getThreads().then(setThreads, (e) => setError(String(e))),
    onError: (err) => setError(String(err?.message ?? err)),
  });

  const send = (e) => {
    e.preventDefault();
    stream.submit({ messages: [{ type: "human", content: draft }] }, { streamMode: ["values"], streamSubgraphs: true, streamResumable: true });
    setDraft("");
  };

  return (
    <main>
      <p id="server">{server}</p>
      <select id="graphs" value={assistantId} readOnly>
        {(assistants ?? []).map((a) => (
          <option key={a.assistant_id} value={a.graph_id} data-assistant={a.assistant_id}>{a.graph_id}</option>
        ))}
      </select>
      <p id="graphs-state">{assistants === null ? "loading" : `${assistants.length}`}</p>
      <ul id="history" data-loaded={threads === null ? "no" : "yes"}>
        {(threads ?? []).map((t) => (
          <li key={t.thread_id} className="thread" data-id={t.thread_id}>
            <button type="button" className="open" onClick={() => setThreadId(t.thread_id)}>{titleOf(t)}</button>
          </li>
        ))}
      </ul>
      <button id="new" type="button" onClick={() => setThreadId(null)}>new chat</button>
      <p>
        thread <span id="thread">{threadId ?? ""}</span>, <span id="status">{stream.isLoading ? "loading" : "idle"}</span>
      </p>
      {error && <p id="error">{error}</p>}
      <ol id="messages">
        {stream.messages.map((m, i) => (
          <li key={m.id ?? i} className={`msg ${m.type}`}>
            <span className="type">{m.type}</span>{" "}<span className="text">{textOf(m)}</span>
          </li>
        ))}
      </ol>
      <form id="send-form" onSubmit={send}>
        <input id="message" value={draft} onChange={(e) => setDraft(e.target.value)} />
        <button id="send" type="submit">send</button>
      </form>
    </main>
  );
}

createRoot(document.getElementById("root")).render(<App />);
