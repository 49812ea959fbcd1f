// The live view of one run: its events replayed from the start and then
// followed (docs/protocol.md 2.10 and 3.6), the answers a person gives
// when it stops for them (2.14), steer (2.13) and cancel (2.12).

import { h, fill, field, timeEl, clock, num, pretty, compact, errorBox, newID } from './dom.js';
import { APIError, getJSON, postJSON, events, readSSE, createAndStream, paths } from './api.js';

// A run is live while pending or running; any other status, including one
// this page does not know yet, has ended it.
const liveStatuses = new Set(['pending', 'running']);

export const threadHash = (t) => `#/threads/${encodeURIComponent(t)}`;
export const runHash = (t, r) => `${threadHash(t)}/runs/${encodeURIComponent(r)}`;

const maxLog = 300;

// charsPerToken turns streamed text into a token estimate while a model
// call has not reported its count yet (English text averages about four
// characters a token with the BPE encodings of current models).
const charsPerToken = 4;

// How often an open approval or question looks for an answer given
// elsewhere (another tab, the CLI, the API).
const answeredPoll = 2000;

// handed is a run this page just submitted, with its event stream already
// open, on its way from the form that submitted it to the view that shows
// it.
let handed = null;

// startRun submits a run on thread and shows it. The run's events come
// back in the same request (POST .../runs/stream): the gateway follows the
// run before it publishes it, so the view misses none of its token deltas,
// however quick the run. prompt is what the person sent, shown at once.
// What the gateway refuses before the run exists (400, 409, ...) is
// thrown for the form to show.
export async function startRun(thread, body, { signal, go, prompt }) {
  // The stream outlives the form's view: the run view takes it over.
  const ctl = new AbortController();
  const stop = () => ctl.abort();
  signal.addEventListener('abort', stop, { once: true });
  let resp;
  try {
    resp = await createAndStream(thread, body, ctl.signal);
  } finally {
    signal.removeEventListener('abort', stop);
  }
  takeHanded();
  handed = { thread, run: body.run_id, resp, ctl, prompt, at: new Date().toISOString() };
  go(runHash(thread, body.run_id));
}

// takeHanded returns the stream handed over for this run, if any, and
// closes any other (the person went elsewhere).
export function takeHanded(thread, run) {
  const x = handed;
  handed = null;
  if (x && x.thread === thread && x.run === run) return x;
  if (x) x.ctl.abort();
  return null;
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => { clearTimeout(timer); resolve(); }, { once: true });
  });
}

// textOf is a message's text: its content, or the text parts of a
// content given as parts.
export function textOf(content) {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return content.filter((p) => p && typeof p.text === 'string').map((p) => p.text).join('\n');
}

function section(id, title, ...body) {
  return h('section', { class: 'panel', 'aria-labelledby': id }, h('h3', { id }, title), body);
}

// renderRun draws the run view into main and follows the run until it
// finishes or signal aborts (the person navigated away).
export async function renderRun(main, { thread, run }, signal, go) {
  document.title = `Run ${run} · natsagent`;
  const submitted = takeHanded(thread, run);
  if (submitted) signal.addEventListener('abort', () => submitted.ctl.abort(), { once: true });
  const statusEl = h('strong', { id: 'run-status', 'data-status': '' }, '…');
  const stopEl = h('span', { id: 'run-stop' });
  const connEl = h('p', { id: 'run-connection', class: 'connection', role: 'status' });
  const titleEl = h('span', { id: 'run-thread-title' });
  const metaEl = h('span', { id: 'run-meta' });
  const timeline = h('ol', { id: 'timeline', class: 'timeline', 'aria-live': 'polite', 'aria-relevant': 'additions text', 'aria-label': 'Messages and tool calls' });
  const outcome = h('div', { id: 'run-outcome' });
  const interruptEl = h('div', { id: 'run-interrupt' });
  const meter = h('meter', { id: 'context-meter', min: 0, max: 1, value: 0, 'aria-labelledby': 'context-h' });
  const meterText = h('p', { id: 'context-text', class: 'muted' }, 'No model call yet.');
  const modelEl = h('p', { id: 'run-model', class: 'muted' });
  const todosEl = h('ul', { id: 'todos', class: 'todos' }, h('li', { class: 'muted' }, 'No todo list.'));
  const subagentsEl = h('ul', { id: 'subagents', class: 'subagents' }, h('li', { class: 'muted' }, 'None.'));
  const compressionEl = h('ul', { id: 'compressions', class: 'log' }, h('li', { class: 'muted' }, 'None.'));
  const usageEl = h('dl', { id: 'run-usage', class: 'facts' });
  const usageNote = h('p', { id: 'run-usage-note', class: 'muted' });
  const logEl = h('ol', { id: 'event-log', class: 'log', 'aria-label': 'Events' });

  const steerMsg = h('textarea', { id: 'steer-message', rows: 2, required: true });
  const steerForm = h('form', { id: 'steer-form', class: 'inline-form' },
    field('Steer: a message for the running agent', steerMsg, 'The agent stops at its next safe point and goes on with this message, keeping what it did.'),
    h('button', { type: 'submit', id: 'steer-send' }, 'Steer'));
  const cancelBtn = h('button', { type: 'button', id: 'cancel-run', class: 'danger' }, 'Cancel run');
  const controlsStatus = h('p', { id: 'controls-status', role: 'status' });
  const controls = h('section', { id: 'run-controls', class: 'panel', 'aria-labelledby': 'controls-h' },
    h('h3', { id: 'controls-h' }, 'While it runs'), steerForm, h('p', {}, cancelBtn), controlsStatus);
  controls.hidden = true; // until the run is known to be live

  main.append(
    h('div', { class: 'run-head' },
      h('h2', { id: 'view-title', tabindex: -1 }, 'Run ', h('code', {}, run)),
      h('p', { class: 'muted' }, 'Thread ', h('a', { id: 'run-thread-link', href: threadHash(thread) }, thread), ' ', titleEl, ' ', metaEl),
      h('p', { class: 'status-line', role: 'status', 'aria-live': 'polite' }, 'Status: ', statusEl, ' ', stopEl),
      connEl),
    h('div', { class: 'run-grid' },
      h('div', { class: 'run-main' },
        section('timeline-h', 'Conversation', timeline),
        outcome, interruptEl, controls),
      h('aside', { class: 'run-side', 'aria-label': 'Run details' },
        section('context-h', 'Context window', meter, meterText, modelEl),
        section('todos-h', 'Todos', todosEl),
        section('subagents-h', 'Subagents', subagentsEl),
        section('compression-h', 'Context compression', compressionEl),
        section('usage-h', 'Token usage', usageEl, usageNote),
        section('log-h', 'Events', h('p', { class: 'muted' }, 'Everything but the streamed text, newest last.'), logEl))));

  // --- state of the stream (docs/protocol.md 2.10.5) ---
  let lastSeq = 0;
  // Seqs jumped over, which an event sent again after a node loss may
  // still fill (protocol.md 2.10.3); at most 256 are remembered.
  const skipped = new Set();
  let attempt = 0;
  let lastID = '';
  let finished = null;
  const messages = new Map(); // message_id -> {li, text, deltas, chars, completed}
  const toolItems = new Map(); // tool_call_id -> li
  const subagents = new Map();
  // Token usage counted so far: each model call's, as its message.completed
  // (or the run.finished output) reports it, once per message.
  const counted = { ids: new Set(), calls: 0, input: 0, output: 0, approximate: false };
  let totals = null; // the run record's usage.total once the run ended
  let inputShown = false;

  function setStatus(status) {
    statusEl.textContent = status;
    statusEl.dataset.status = status;
    controls.hidden = !liveStatuses.has(status);
  }

  function message(id, time) {
    let m = messages.get(id);
    if (!m) {
      const text = h('div', { class: 'text' });
      const li = h('li', { class: 'message assistant', 'data-message-id': id, 'data-deltas': '0' },
        h('div', { class: 'who' }, 'Assistant ', clock(time)), text);
      m = { li, text, deltas: 0, chars: 0, completed: false };
      messages.set(id, m);
      timeline.append(li);
    }
    return m;
  }

  function tool(d, time) {
    let li = toolItems.get(d.tool_call_id);
    if (!li) {
      li = h('li', { class: 'tool', 'data-tool-call-id': d.tool_call_id || '', 'data-status': 'running' },
        h('div', { class: 'who' }, 'Tool ', h('code', { class: 'tool-name' }, d.name || '?'), ' ',
          h('span', { class: 'tool-status' }, 'running'), ' ', clock(time)),
        h('details', { class: 'tool-args' }, h('summary', {}, 'Arguments'), h('pre', {}, pretty(d.arguments || ''))),
        h('pre', { class: 'tool-result', hidden: true }));
      toolItems.set(d.tool_call_id, li);
      timeline.append(li);
    }
    return li;
  }

  function logEvent(env) {
    const li = h('li', { 'data-type': env.type },
      clock(env.time), ' ', h('span', { class: 'log-type' }, env.type), ' ', h('span', { class: 'muted' }, `#${env.seq || '–'}`), ' ',
      h('code', {}, compact(env.data)));
    logEl.append(li);
    while (logEl.children.length > maxLog) logEl.firstElementChild.remove();
  }

  function renderTodos(todos) {
    if (!Array.isArray(todos) || todos.length === 0) {
      fill(todosEl, h('li', { class: 'muted' }, 'No todo list.'));
      return;
    }
    fill(todosEl, todos.map((t) => h('li', { 'data-status': t.status },
      h('span', { class: 'todo-status' }, (t.status || '').replace('_', ' ')), ' ', t.content)));
  }

  function renderContext(d) {
    const c = d.context || {};
    const tokens = c.context_tokens ?? c.tokens;
    const window = c.context_window ?? c.window;
    if (typeof tokens === 'number' && typeof window === 'number' && window > 0) {
      meter.max = window;
      meter.value = Math.min(tokens, window);
      const trigger = c.summarization_trigger_tokens;
      if (trigger) {
        meter.high = trigger;
        meter.optimum = 0;
      }
      const pct = ((tokens / window) * 100).toFixed(1);
      meterText.textContent = `${num(tokens)} of ${num(window)} tokens (${pct}%)` +
        (trigger ? `; compression at ${num(trigger)}` : '');
    } else if (typeof tokens === 'number') {
      meterText.textContent = `${num(tokens)} tokens (window unknown)`;
    }
    if (d.model) fill(modelEl, 'Model ', h('code', {}, d.model));
  }

  // count adds a model call's usage to the live totals, once per message.
  function count(id, u) {
    if (!u || (id && counted.ids.has(id))) return;
    if (id) counted.ids.add(id);
    counted.calls += 1;
    counted.input += u.input_tokens || 0;
    counted.output += u.output_tokens || 0;
    if (u.approximate) counted.approximate = true;
  }

  // renderUsage shows the token totals: while the run streams, what the
  // finished model calls reported plus an estimate of the text streaming
  // now; once it ended, the run record's totals.
  function renderUsage() {
    if (totals) {
      fill(usageEl,
        h('dt', {}, 'Input'), h('dd', { id: 'run-usage-input' }, num(totals.input_tokens)),
        h('dt', {}, 'Output'), h('dd', { id: 'run-usage-output' }, num(totals.output_tokens)),
        h('dt', {}, 'Total'), h('dd', { id: 'run-usage-total' }, num(totals.total_tokens)),
        h('dt', {}, 'Model calls'), h('dd', { id: 'run-usage-calls' }, num(totals.calls)));
      usageNote.textContent = 'The run\'s totals, from its record.';
      return;
    }
    let chars = 0;
    for (const m of messages.values()) if (!m.completed) chars += m.chars;
    const streaming = Math.ceil(chars / charsPerToken);
    const approx = counted.approximate ? '≈ ' : '';
    fill(usageEl,
      h('dt', {}, 'Input'), h('dd', { id: 'run-usage-input' }, approx + num(counted.input)),
      h('dt', {}, 'Output'), h('dd', { id: 'run-usage-output' }, approx + num(counted.output)),
      h('dt', {}, 'Total'), h('dd', { id: 'run-usage-total' }, approx + num(counted.input + counted.output)),
      h('dt', {}, 'Model calls'), h('dd', { id: 'run-usage-calls' }, num(counted.calls)),
      streaming ? [h('dt', {}, 'Streaming now'), h('dd', { id: 'run-usage-streaming' }, `≈ ${num(streaming)} output tokens`)] : null);
    usageNote.textContent = 'Counted as each model call finishes' + (counted.approximate ? ' (≈: the model reported no count; estimated)' : '') +
      (streaming ? `; the text streaming now is estimated at ${charsPerToken} characters a token until its call finishes.` : '.');
  }

  function renderSubagent(type, d) {
    if (subagents.size === 0) subagentsEl.replaceChildren();
    const key = d.run_id || d.tool_call_id || type;
    let s = subagents.get(key);
    if (!s) {
      const name = h('span', { class: 'sub-name' });
      const status = h('span', { class: 'sub-status' });
      const line = h('div', { class: 'muted sub-line' });
      const link = d.thread_id && d.run_id ? h('a', { href: runHash(d.thread_id, d.run_id) }, 'open') : '';
      s = { li: h('li', {}, name, ' ', status, ' ', link, line), name, status, line };
      subagents.set(key, s);
      subagentsEl.append(s.li);
    }
    if (type === 'subagent.limited') {
      s.name.textContent = 'limit reached';
      s.line.textContent = `dropped ${(d.dropped || []).length} call(s) (${d.reason || ''})`;
      return;
    }
    s.name.textContent = d.subagent || 'subagent';
    if (d.status) s.status.textContent = d.status;
    if (type === 'subagent.progress' && d.line) s.line.textContent = d.line;
    if (type === 'subagent.finished' && (d.error || d.stop_reason)) s.line.textContent = d.error || d.stop_reason;
  }

  function renderCompression(env) {
    if (!compressionEl.querySelector('[data-type]')) compressionEl.replaceChildren();
    const d = env.data || {};
    const facts = Object.entries(d).filter(([, v]) => v === null || typeof v !== 'object')
      .map(([k, v]) => `${k}: ${typeof v === 'number' ? num(v) : v}`).join(', ');
    compressionEl.append(h('li', { 'data-type': env.type }, timeEl(env.time), ' ', env.type, facts ? ` (${facts})` : ''));
  }

  function handle(env) {
    const d = env.data || {};
    if (env.seq) {
      if (env.seq > lastSeq) {
        for (let s = lastSeq + 1; lastSeq > 0 && s < env.seq && skipped.size < 256; s++) skipped.add(s);
        lastSeq = env.seq;
      } else if (skipped.has(env.seq) && env.type !== 'message.delta') {
        skipped.delete(env.seq); // late, not a duplicate; a late delta's text is in message.completed
      } else {
        return; // a duplicate
      }
    }
    if (env.attempt && env.attempt < attempt) return; // a paused worker's late event
    if (env.type !== 'message.delta') logEvent(env);
    switch (env.type) {
      case 'run.queued':
        setStatus('pending');
        break;
      case 'run.started':
        if (attempt > 0 && (d.attempt || 0) > attempt) {
          // Another worker took over: text never completed is void.
          for (const [id, m] of messages) {
            if (!m.completed) { m.li.remove(); messages.delete(id); }
          }
        }
        attempt = Math.max(attempt, d.attempt || env.attempt || 0);
        setStatus('running');
        showInput();
        break;
      case 'message.delta': {
        const m = message(d.message_id, env.time);
        if (m.completed) break; // its whole text is shown
        m.deltas += 1;
        m.li.dataset.deltas = String(m.deltas);
        m.chars += (d.delta || '').length;
        m.li.dataset.streamedChars = String(m.chars);
        m.text.append(d.delta || '');
        renderUsage();
        break;
      }
      case 'message.completed': {
        const m = message(d.id, env.time);
        m.completed = true;
        m.li.dataset.completed = 'true';
        showInput();
        if (d.content) m.text.textContent = d.content;
        // Protocol v2: the call's usage and context ride on the message
        // (meta.usage with step); v1 sent them apart as usage.model.
        const u = d.meta && d.meta.usage;
        if (u && u.step !== undefined) renderContext(u);
        count(d.id, u);
        renderUsage();
        if (d.tool_calls && d.tool_calls.length) {
          m.li.append(h('div', { class: 'calls' }, 'Asks to run ',
            d.tool_calls.map((c, i) => [i ? ', ' : '', h('code', {}, c.name)])));
        }
        break;
      }
      case 'model.retry':
        if (d.message_id && messages.has(d.message_id)) {
          const m = messages.get(d.message_id);
          m.text.textContent = '';
          m.deltas = 0;
          m.chars = 0;
          renderUsage();
        }
        break;
      case 'tool.started':
        tool(d, env.time);
        break;
      case 'tool.finished': {
        const li = tool(d, env.time);
        li.dataset.status = d.status || 'success';
        li.querySelector('.tool-status').textContent = d.status || 'success';
        const res = li.querySelector('.tool-result');
        res.hidden = false;
        res.textContent = d.result || '';
        break;
      }
      case 'state.todos':
        renderTodos(d.todos);
        break;
      case 'thread.titled':
        titleEl.textContent = d.title ? `“${d.title}”` : '';
        break;
      case 'usage.model': // protocol v1 runs
        renderContext(d);
        count(d.message_id, d);
        renderUsage();
        break;
      case 'run.finished':
        finish(env);
        break;
      default:
        if (env.type.startsWith('subagent.')) renderSubagent(env.type, d);
        if (/compress/i.test(env.type)) renderCompression(env);
    }
  }

  function finish(env) {
    const d = env.data || {};
    finished = d;
    setStatus(d.status);
    stopEl.textContent = d.stop_reason ? `(stopped: ${d.stop_reason})` : '';
    const parts = [];
    if (d.error) parts.push(errorBox(d.error));
    if (d.output && d.output.content) {
      const shown = d.output.id && messages.get(d.output.id);
      if (!shown || !shown.text.textContent) {
        const m = message(d.output.id || 'output', env.time);
        m.text.textContent = d.output.content;
        m.completed = true;
      }
    }
    for (const m of messages.values()) m.completed = true; // nothing streams any more
    if (d.output) count(d.output.id, d.output.meta && d.output.meta.usage);
    renderUsage();
    if (d.superseded_by) {
      parts.push(h('p', {}, 'Replaced by run ', h('a', { id: 'superseded-link', href: runHash(thread, d.superseded_by) }, d.superseded_by), '.'));
    }
    fill(outcome, parts);
    showInput();
    if (d.status === 'interrupted' && d.interrupt) renderInterrupt(d.interrupt);
    // The record carries the run's token totals once it ended: every
    // model call of the run, summaries included.
    getJSON(paths.run(thread, run), { signal }).then((rec) => {
      const t = rec.usage && rec.usage.total;
      if (t) {
        totals = t;
        renderUsage();
      } else if (!counted.calls) {
        fill(usageEl, h('dt', {}, 'Totals'), h('dd', {}, 'no model call'));
        usageNote.textContent = '';
      }
    }).catch(() => {});
  }

  // --- answers to an interrupt ---

  async function resume(resumeValue, prompt, button, statusEl) {
    button.disabled = true;
    statusEl.textContent = 'Sending…';
    try {
      await startRun(thread, { run_id: newID(), command: { resume: resumeValue } }, { signal, go, prompt });
    } catch (err) {
      if (signal.aborted) return;
      fill(statusEl, errorBox(err));
      button.disabled = false;
    }
  }

  // answeredBy returns the run that came after this one on the thread (a
  // resume, or new input, which answered the interrupt), or ''.
  async function answeredBy() {
    const [latest] = await getJSON(paths.latestRun(thread), { signal });
    return latest && latest.run_id !== run ? latest.run_id : '';
  }

  function showAnswered(next) {
    fill(interruptEl, h('p', { id: 'interrupt-answered', class: 'muted' }, 'This run waited for a person; run ',
      h('a', { href: runHash(thread, next) }, next), ' came after it.'));
  }

  async function renderInterrupt(intr) {
    try {
      const next = await answeredBy();
      if (next) { showAnswered(next); return; }
    } catch (err) {
      if (signal.aborted) return;
    }
    if (intr.kind === 'approval') fill(interruptEl, approvalForm(intr));
    else if (intr.kind === 'clarification') fill(interruptEl, clarificationForm(intr));
    else fill(interruptEl, h('p', {}, `The run waits for a person (${intr.kind}); answer it with the API.`));
    const first = interruptEl.querySelector('input, textarea, button');
    if (first) first.focus();
    // Someone may answer elsewhere (another tab, the CLI, the API): the
    // form goes as soon as a later run shows on the thread, so the page
    // never offers to answer what was answered.
    while (!signal.aborted) {
      await sleep(answeredPoll, signal);
      if (signal.aborted) return;
      try {
        const next = await answeredBy();
        if (next) { showAnswered(next); return; }
      } catch {
        // a failed look is tried again at the next tick
      }
    }
  }

  const decisionLabels = { approve: 'Approve', reject: 'Reject', edit: 'Edit arguments', respond: 'Answer instead' };

  // decisionsText says what the person decided, for the resumed run's view.
  function decisionsText(reqs, ds) {
    return ds.map((d, i) => `${decisionLabels[d.type] || d.type} ${(reqs[i] && reqs[i].name) || 'the call'}` +
      (d.message ? `: ${d.message}` : '')).join('\n');
  }

  function approvalForm(intr) {
    const allowed = (intr.allowed_decisions && intr.allowed_decisions.length) ? intr.allowed_decisions : ['approve', 'reject'];
    const reqs = intr.action_requests || [];
    const status = h('p', { id: 'approval-status', role: 'status' });
    const send = h('button', { type: 'submit', id: 'approval-send', class: 'primary' }, 'Send decisions');
    const items = reqs.map((ar, i) => {
      const msg = h('textarea', { id: `decision-${i}-message`, rows: 2 });
      const args = h('textarea', { id: `decision-${i}-arguments`, rows: 4, spellcheck: 'false' }, pretty(ar.arguments || '{}'));
      const argsField = field('New arguments (a JSON object)', args);
      argsField.hidden = true;
      const radios = allowed.map((d) => {
        const input = h('input', { type: 'radio', name: `decision-${i}`, value: d, id: `decision-${i}-${d}`, required: true,
          onchange: () => { argsField.hidden = d !== 'edit'; } });
        return h('span', { class: 'choice' }, input, h('label', { for: input.id }, decisionLabels[d] || d));
      });
      const fs = h('fieldset', { class: 'decision', 'data-tool-call-id': ar.tool_call_id },
        h('legend', {}, `Call ${i + 1}: `, h('code', {}, ar.name)),
        ar.description ? h('p', {}, ar.description) : null,
        h('pre', { class: 'tool-args' }, pretty(ar.arguments || '')),
        h('div', { class: 'choices' }, radios),
        field('Message (optional; the reason for a reject, the result for an answer)', msg),
        argsField);
      return { fs, msg, args, i };
    });
    const decisions = () => items.map(({ msg, args, i }) => {
      const chosen = form.querySelector(`input[name="decision-${i}"]:checked`);
      if (!chosen) throw new Error(`Choose a decision for call ${i + 1}.`);
      const d = { type: chosen.value };
      if (msg.value.trim()) d.message = msg.value.trim();
      if (d.type === 'respond' && !d.message) throw new Error(`Call ${i + 1}: write the answer the agent should get.`);
      if (d.type === 'edit') {
        let v;
        try { v = JSON.parse(args.value); } catch { v = null; }
        if (!v || typeof v !== 'object' || Array.isArray(v)) throw new Error(`Call ${i + 1}: the new arguments must be a JSON object.`);
        d.arguments = v;
      }
      return d;
    });
    const all = (type) => () => {
      for (const { i } of items) {
        const r = form.querySelector(`#decision-${i}-${type}`);
        if (r) r.checked = true;
      }
      form.requestSubmit(send);
    };
    const form = h('form', { id: 'approval-form', class: 'interrupt panel', 'aria-labelledby': 'approval-h', novalidate: true },
      h('h3', { id: 'approval-h' }, 'Approval needed'),
      h('p', {}, reqs.length === 1 ? 'The agent wants to run this tool call:' : `The agent wants to run these ${reqs.length} tool calls; decide on each:`),
      items.map((x) => x.fs),
      h('div', { class: 'buttons' }, send,
        allowed.includes('approve') ? h('button', { type: 'button', id: 'approve-all', onclick: all('approve') }, 'Approve all') : null,
        allowed.includes('reject') ? h('button', { type: 'button', id: 'reject-all', onclick: all('reject') }, 'Reject all') : null),
      status);
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      let ds;
      try {
        ds = decisions();
      } catch (err) {
        fill(status, errorBox(err));
        return;
      }
      resume({ decisions: ds }, decisionsText(reqs, ds), send, status);
    });
    return form;
  }

  function clarificationForm(intr) {
    const answer = h('textarea', { id: 'answer-input', rows: 2, required: true });
    const send = h('button', { type: 'submit', id: 'answer-send', class: 'primary' }, 'Send answer');
    const status = h('p', { id: 'answer-status', role: 'status' });
    const options = (intr.options || []).map((o) => h('button', { type: 'button', class: 'option',
      onclick: () => { answer.value = o; answer.focus(); } }, o));
    const form = h('form', { id: 'answer-form', class: 'interrupt panel', 'aria-labelledby': 'answer-h' },
      h('h3', { id: 'answer-h' }, 'The agent asks'),
      h('p', { class: 'question', id: 'question' }, intr.question || ''),
      options.length ? h('div', { class: 'buttons', 'aria-label': 'Suggested answers' }, options) : null,
      field('Your answer', answer), h('div', { class: 'buttons' }, send), status);
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      if (!answer.value.trim()) { fill(status, errorBox('Write an answer first.')); return; }
      resume({ answer: answer.value.trim() }, answer.value.trim(), send, status);
    });
    return form;
  }

  // --- steer and cancel ---

  steerForm.addEventListener('submit', async (e) => {
    e.preventDefault();
    const text = steerMsg.value.trim();
    if (!text) { fill(controlsStatus, errorBox('Write the message to steer with.')); return; }
    const btn = steerForm.querySelector('button');
    btn.disabled = true;
    controlsStatus.textContent = 'Steering…';
    try {
      await startRun(thread, {
        run_id: newID(), multitask_strategy: 'steer', input: { messages: [{ role: 'user', content: text }] },
      }, { signal, go, prompt: text });
    } catch (err) {
      if (signal.aborted) return;
      fill(controlsStatus, errorBox(err));
      btn.disabled = false;
    }
  });

  cancelBtn.addEventListener('click', async () => {
    cancelBtn.disabled = true;
    controlsStatus.textContent = 'Cancelling…';
    try {
      const reply = await postJSON(paths.cancel(thread, run), undefined, { signal });
      controlsStatus.textContent = `Cancel sent; the run is ${reply.status}.`;
    } catch (err) {
      if (signal.aborted) return;
      fill(controlsStatus, errorBox(err));
      cancelBtn.disabled = false;
    }
  });

  // --- load, then follow ---

  let createdAt = '';
  const showRecord = (rec) => {
    createdAt = rec.created_at || '';
    fill(metaEl, '· agent ', h('code', {}, rec.agent || '?'), ' · created ', timeEl(rec.created_at));
  };
  if (submitted) {
    // This page submitted the run: its events are on their way, and the
    // prompt is known.
    setStatus('pending');
    showPrompt([submitted.prompt], submitted.at);
    getJSON(paths.run(thread, run), { signal }).then(showRecord).catch(() => {});
  } else {
    try {
      const rec = await getJSON(paths.run(thread, run), { signal });
      setStatus(rec.status);
      showRecord(rec);
    } catch (err) {
      if (signal.aborted) return;
      fill(main, h('h2', { id: 'view-title', tabindex: -1 }, 'Run ', h('code', {}, run)), errorBox(err),
        h('p', {}, h('a', { href: threadHash(thread) }, 'Back to the thread')));
      return;
    }
    showInput();
  }

  // showPrompt puts what the person sent at the top of the conversation.
  function showPrompt(texts, time) {
    texts = texts.filter((t) => t);
    if (inputShown || !texts.length) return;
    inputShown = true;
    timeline.prepend(...texts.map((t) => h('li', { class: 'message user' },
      h('div', { class: 'who' }, 'You ', clock(time)), h('div', { class: 'text' }, t))));
  }

  // What the person sent, for a run this page did not submit: the user
  // messages the run added to the thread. They are in the thread once the
  // run checkpointed its first step, so a live run looks again when it
  // starts, when a message completes and when it ends.
  async function showInput() {
    if (inputShown) return;
    try {
      const st = await getJSON(paths.state(thread), { signal });
      const mine = (st.values.messages || []).filter((m) => m.role === 'user' && m.meta && m.meta.run_id === run);
      showPrompt(mine.map((m) => textOf(m.content)), createdAt);
    } catch {
      // the transcript is a courtesy; the events are the view
    }
  }

  let opened = submitted && submitted.resp;
  let backoff = 500;
  while (!signal.aborted && !finished) {
    try {
      const following = () => { timeline.dataset.following = 'true'; };
      let frames;
      if (opened) {
        // The stream the submission opened, read once; a drop resumes
        // with Last-Event-ID like any other stream.
        following();
        frames = readSSE(opened);
        opened = null;
      } else {
        frames = events(thread, run, lastID, signal, following);
      }
      for await (const frame of frames) {
        if (frame.id) lastID = frame.id;
        let env;
        try { env = JSON.parse(frame.data); } catch { continue; }
        handle(env);
        connEl.textContent = '';
        backoff = 500;
        if (finished) break;
      }
    } catch (err) {
      if (signal.aborted) return;
      if (err instanceof APIError && err.status >= 400 && err.status < 500) {
        fill(connEl, errorBox(err));
        return;
      }
      connEl.textContent = `Connection lost (${err.message}); reconnecting…`;
    }
    if (finished || signal.aborted) return;
    await sleep(backoff, signal);
    backoff = Math.min(backoff * 2, 10000);
  }
}
