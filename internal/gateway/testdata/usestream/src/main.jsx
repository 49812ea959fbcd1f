// A chat page built on useStream from the official LangGraph SDK, the way
// Agent Chat UI uses it: it submits messages, renders the streamed
// messages, shows an approval interrupt and resumes it, edits an earlier
// message into a new branch, and regenerates an answer (Agent Chat UI's
// regenerate: a run without input from the checkpoint before the answer). internal/gateway's
// TestUseStreamInBrowser serves it from the gateway's origin and drives it
// in headless Chromium. The DOM ids and classes are what the test reads.
import { useEffect, useState } from "react";
import { createRoot } from "react-dom/client";
import { useStream } from "@langchain/langgraph-sdk/react";

// What the answers looked like on screen, render by render: the test checks
// the text grew while the run streamed.
window.__renders = [];

function textOf(m) {
  if (typeof m.content === "string") return m.content;
  if (Array.isArray(m.content)) {
    return m.content.filter((b) => b && b.type === "text").map((b) => b.text).join("");
  }
  return "";
}

function Message({ stream, message, index, onEdit, onRegenerate }) {
  const meta = stream.getMessagesMetadata(message, index);
  const options = meta?.branchOptions ?? [];
  const at = options.indexOf(meta?.branch);
  return (
    <li className={`msg ${message.type}`} data-id={message.id ?? ""} data-index={index}>
      <span className="type">{message.type}</span>{" "}
      <span className="text">{textOf(message)}</span>
      {(message.tool_calls ?? []).map((tc) => (
        <span className="tool-call" key={tc.id}>{tc.name}</span>
      ))}
      {message.type === "human" && (
        <button className="edit" type="button" onClick={() => onEdit(message, index)}>edit</button>
      )}
      {message.type === "ai" && (
        <button className="regenerate" type="button" onClick={() => onRegenerate(message, index)}>regenerate</button>
      )}
      {options.length > 1 && (
        <span className="branches" data-branch={meta.branch}>
          <button className="branch-prev" type="button" disabled={at <= 0}
            onClick={() => stream.setBranch(options[at - 1])}>prev</button>
          <span className="branch-at">{`${at + 1}/${options.length}`}</span>
          <button className="branch-next" type="button" disabled={at >= options.length - 1}
            onClick={() => stream.setBranch(options[at + 1])}>next</button>
        </span>
      )}
    </li>
  );
}

function Interrupt({ stream }) {
  const value = stream.interrupt?.value;
  const actions = value?.action_requests ?? [];
  const approve = () => {
    const decisions = actions.map(() => ({ type: "approve" }));
    stream.submit(undefined, { command: { resume: { decisions } } });
  };
  return (
    <div id="interrupt">
      {actions.map((a, i) => (
        <div className="action" key={i}>
          <span className="action-name">{a.name}</span>{" "}
          <code className="action-args">{JSON.stringify(a.args)}</code>
        </div>
      ))}
      <button id="approve" type="button" onClick={approve}>approve</button>
    </div>
  );
}

function App() {
  const [threadId, setThreadId] = useState(null);
  const [error, setError] = useState("");
  const [draft, setDraft] = useState("");
  const [editing, setEditing] = useState(null); // {message, index}
  const [editText, setEditText] = useState("");
  const stream = useStream({
    apiUrl: window.location.origin,
    assistantId: "chatbot",
    threadId,
    onThreadId: setThreadId,
    // LangGraph stores a checkpoint per step (the question, each answer,
    // each tool batch): the default ten do not reach back over the
    // branches this page switches between.
    fetchStateHistory: { limit: 100 },
    onError: (err) => setError(String(err?.message ?? err)),
  });
  const messages = stream.messages;

  useEffect(() => {
    const texts = [...document.querySelectorAll("#messages .msg.ai")].map((el) => ({
      id: el.dataset.id,
      text: el.querySelector(".text").textContent,
    }));
    const last = window.__renders.at(-1);
    const entry = { loading: stream.isLoading, texts };
    if (!last || JSON.stringify(last) !== JSON.stringify(entry)) window.__renders.push(entry);
  });

  const send = (e) => {
    e.preventDefault();
    stream.submit({ messages: [{ type: "human", content: draft }] });
    setDraft("");
  };
  const sendEdit = (e) => {
    e.preventDefault();
    const meta = stream.getMessagesMetadata(editing.message, editing.index);
    const parent = meta?.firstSeenState?.parent_checkpoint;
    window.__forkedFrom = parent ?? null;
    stream.submit({ messages: [{ type: "human", content: editText }] }, { checkpoint: parent });
    setEditing(null);
    setEditText("");
  };

  const regenerate = (message, index) => {
    const meta = stream.getMessagesMetadata(message, index);
    const parent = meta?.firstSeenState?.parent_checkpoint;
    window.__regeneratedFrom = parent ?? null;
    stream.submit(undefined, { checkpoint: parent });
  };

  return (
    <main>
      <p>
        thread <span id="thread">{threadId ?? ""}</span>, <span id="status">{stream.isLoading ? "loading" : "idle"}</span>
      </p>
      {error && <p id="error">{error}</p>}
      <ol id="messages">
        {messages.map((m, i) => (
          <Message key={m.id ?? i} stream={stream} message={m} index={i}
            onEdit={(message, index) => { setEditing({ message, index }); setEditText(""); }}
            onRegenerate={regenerate} />
        ))}
      </ol>
      {stream.interrupt && <Interrupt stream={stream} />}
      {editing ? (
        <form id="edit-form" onSubmit={sendEdit}>
          <input id="edit-text" value={editText} onChange={(e) => setEditText(e.target.value)} />
          <button id="edit-send" type="submit">send edit</button>
        </form>
      ) : (
        <form id="send-form" onSubmit={send}>
          <input id="message" value={draft} onChange={(e) => setDraft(e.target.value)} />
          <button id="send" type="submit">send</button>
        </form>
      )}
    </main>
  );
}

createRoot(document.getElementById("root")).render(<App />);
