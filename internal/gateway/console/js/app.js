// natsagent web console: threads, runs and the live view of a run, over
// the gateway's HTTP API. Views are routed by the URL fragment
// (#/threads/<thread>/runs/<run>), so the gateway serves one page.

import { h, append, fill, field, timeEl, num, statusBadge, errorBox, newID, idPattern, confirmAction } from './dom.js';
import { getJSON, request, paths, settings, saveSettings, onKeyNeeded, download, upload, deleteThread } from './api.js';
import { renderRun, runHash, threadHash, startRun, takeHanded, textOf } from './run.js';

const main = document.getElementById('main');

export function go(hash) {
  if (location.hash === hash) route(true);
  else location.hash = hash;
}

// --- the API key and tenant dialog ---

const dialog = document.getElementById('key-dialog');
const keyForm = document.getElementById('key-form');
const keyInput = document.getElementById('key-input');
const tenantInput = document.getElementById('tenant-input');
const keyReason = document.getElementById('key-reason');
const keyState = document.getElementById('key-state');
let pendingKey = null;

function showKeyState() {
  const { key, tenant } = settings();
  keyState.textContent = (key ? 'API key set' : 'no API key') + (tenant ? ` · tenant ${tenant}` : '');
}

// openSettings shows the dialog; it resolves true when the person saved.
function openSettings(reason) {
  return new Promise((resolve) => {
    const cur = settings();
    keyReason.textContent = reason || '';
    keyReason.hidden = !reason;
    keyInput.value = '';
    keyInput.placeholder = cur.key ? 'unchanged' : '';
    tenantInput.value = cur.tenant;
    dialog.returnValue = '';
    dialog.addEventListener('close', () => {
      showKeyState();
      resolve(dialog.returnValue === 'saved');
    }, { once: true });
    dialog.showModal();
    keyInput.focus();
  });
}

keyForm.addEventListener('submit', (e) => {
  e.preventDefault();
  const cur = settings();
  saveSettings({ key: keyInput.value.trim() || cur.key, tenant: tenantInput.value.trim() });
  dialog.close('saved');
});
document.getElementById('key-forget').addEventListener('click', () => {
  saveSettings({ key: '', tenant: tenantInput.value.trim() });
  dialog.close('forgot');
});
document.getElementById('key-cancel').addEventListener('click', () => dialog.close('cancel'));

// Several requests may be refused at once: they share one question.
onKeyNeeded((reason) => {
  if (!pendingKey) {
    pendingKey = openSettings(reason).then((saved) => saved && !!settings().key);
    pendingKey.finally(() => { pendingKey = null; });
  }
  return pendingKey;
});

document.getElementById('settings-button').addEventListener('click', async () => {
  if (await openSettings('')) route(false);
});

// --- the new run form ---

function runForm({ thread, signal, id = 'run-form' }) {
  const threadIn = thread ? null : h('input', { id: 'run-thread', name: 'thread', pattern: idPattern, autocomplete: 'off', spellcheck: 'false' });
  const message = h('textarea', { id: 'run-message', name: 'message', rows: 3, required: true });
  const agent = h('input', { id: 'run-agent', name: 'agent', pattern: idPattern, autocomplete: 'off', spellcheck: 'false', placeholder: 'chatbot' });
  const approval = h('select', { id: 'run-approval', name: 'approval' },
    h('option', { value: '' }, 'ask before writing files or running commands'),
    h('option', { value: 'always_trust' }, 'always trust: run every tool'));
  const strategy = h('select', { id: 'run-strategy', name: 'strategy' },
    ['enqueue', 'reject', 'steer', 'rollback'].map((s) => h('option', { value: s }, s)));
  const submit = h('button', { type: 'submit', id: 'run-submit', class: 'primary' }, 'Start run');
  const status = h('p', { class: 'form-status', id: 'run-form-status', role: 'status' });
  // The run id is chosen here and kept while the same form is retried, so
  // a submission whose answer was lost is not run twice.
  let runID = '';
  let threadID = '';
  const form = h('form', { id, class: 'run-form' },
    threadIn ? field('Thread id (optional)', threadIn, 'Empty: a new thread. Letters, digits, - and _.') : null,
    field('Message', message),
    h('details', { class: 'options' }, h('summary', {}, 'Options'),
      field('Agent (optional)', agent),
      field('Tool approval', approval),
      field('If the thread is busy', strategy, 'enqueue waits; reject refuses; steer and rollback replace the active run.')),
    h('div', { class: 'buttons' }, submit), status);
  form.addEventListener('input', () => { runID = ''; threadID = ''; });
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    if (!form.reportValidity()) return;
    if (!runID) {
      runID = newID();
      threadID = thread || threadIn.value.trim() || newID();
    }
    const prompt = message.value;
    const body = { run_id: runID, input: { messages: [{ role: 'user', content: prompt }] } };
    if (agent.value.trim()) body.agent = agent.value.trim();
    if (approval.value) body.config = { tool_approval_mode: approval.value };
    if (strategy.value !== 'enqueue') body.multitask_strategy = strategy.value;
    submit.disabled = true;
    status.textContent = 'Submitting…';
    try {
      await startRun(threadID, body, { signal, go, prompt });
    } catch (err) {
      if (signal.aborted) return;
      fill(status, errorBox(err));
      submit.disabled = false;
    }
  });
  return form;
}

// --- views ---

function title(text) {
  return h('h2', { id: 'view-title', tabindex: -1 }, text);
}

function section(id, heading, ...body) {
  return h('section', { class: 'panel', 'aria-labelledby': id }, h('h3', { id }, heading), body);
}

// load fills el with what render makes of the API's answer, or the error.
async function load(el, path, signal, render) {
  try {
    const v = await getJSON(path, { signal });
    fill(el, render(v));
  } catch (err) {
    if (!signal.aborted) fill(el, errorBox(err));
  }
}

// Threads are listed a page at a time with POST /threads/search, newest
// update first. The search box takes a thread id, or metadata as
// key=value words; the filters and the page live in the URL fragment
// (#/?q=...&status=...&page=...), so a reload keeps them.
const pageSize = 20;
const threadStatuses = ['idle', 'busy', 'interrupted', 'error'];
const idRe = new RegExp(`^${idPattern}$`);

// searchBody turns the search box and the status filter into a search
// request for one page (one thread more than shown, to know whether a
// next page exists).
function searchBody(q, status, page) {
  const body = { limit: pageSize + 1, offset: page * pageSize, sort_by: 'updated_at', sort_order: 'desc' };
  if (status) body.status = status;
  const words = q.split(/\s+/).filter(Boolean);
  if (words.length && words.every((w) => w.indexOf('=') > 0)) {
    body.metadata = {};
    for (const w of words) {
      const i = w.indexOf('=');
      body.metadata[w.slice(0, i)] = w.slice(i + 1);
    }
  } else if (words.length === 1 && idRe.test(words[0])) {
    body.ids = words;
  } else if (words.length) {
    throw new Error('Search for one thread id, or for metadata as key=value words (all must match).');
  }
  return body;
}

function threadsView(signal, params) {
  document.title = 'Threads · natsagent';
  let page = Math.max(0, Number.parseInt(params.get('page') || '1', 10) - 1) || 0;
  const query = h('input', { type: 'search', id: 'threads-query', name: 'q', autocomplete: 'off', spellcheck: 'false', value: params.get('q') || '' });
  const status = h('select', { id: 'threads-status', name: 'status' },
    h('option', { value: '' }, 'any status'), threadStatuses.map((st) => h('option', { value: st }, st)));
  status.value = threadStatuses.includes(params.get('status')) ? params.get('status') : '';
  const list = h('div', { id: 'threads' }, h('p', { class: 'muted' }, 'Loading…'));
  const note = h('p', { id: 'threads-note', role: 'status' });
  const prev = h('button', { type: 'button', id: 'threads-prev', disabled: true }, '← Newer');
  const next = h('button', { type: 'button', id: 'threads-next', disabled: true }, 'Older →');
  const where = h('span', { id: 'threads-page', class: 'muted' });
  const filter = h('form', { id: 'threads-filter', class: 'filter-form', role: 'search' },
    field('Search', query, 'A thread id, or metadata as key=value (several: all must match).'),
    field('Status', status),
    h('div', { class: 'buttons' }, h('button', { type: 'submit', id: 'threads-search' }, 'Search')));

  let shown = 0; // requests in flight answer in order: only the last counts
  async function refresh() {
    const mine = ++shown;
    const q = query.value.trim();
    const fragment = new URLSearchParams();
    if (q) fragment.set('q', q);
    if (status.value) fragment.set('status', status.value);
    if (page > 0) fragment.set('page', String(page + 1));
    const qs = fragment.toString();
    const hash = qs ? `#/?${qs}` : '#/';
    if ((location.hash || '#/') !== hash) history.replaceState(null, '', hash);
    prev.disabled = true;
    next.disabled = true;
    let threads;
    let total = null;
    try {
      const resp = await request('POST', paths.threadSearch(), { body: searchBody(q, status.value, page), signal });
      const t = resp.headers.get('X-Pagination-Total');
      if (t !== null && t !== '') total = Number(t);
      threads = await resp.json();
    } catch (err) {
      if (signal.aborted || mine !== shown) return;
      fill(list, errorBox(err));
      fill(where, '');
      return;
    }
    if (mine !== shown) return;
    if (!threads.length && page > 0) {
      // The page emptied (deletions): show the last one with threads.
      page -= 1;
      refresh();
      return;
    }
    const more = threads.length > pageSize;
    threads = threads.slice(0, pageSize);
    prev.disabled = page === 0;
    next.disabled = !more;
    const first = page * pageSize + 1;
    fill(where, threads.length ? `${num(first)}–${num(first + threads.length - 1)}${total !== null ? ` of ${num(total)}` : ''}` : '');
    fill(list, threadsTable(threads, q || status.value, remove));
  }

  async function remove(t) {
    const name = t.title ? `“${t.title}” (${t.thread_id})` : t.thread_id;
    const busy = t.status === 'busy';
    const ok = await confirmAction({
      title: 'Delete this thread?',
      text: `Thread ${name}, with its messages, runs, files and token usage, is deleted for good.` +
        (busy ? ' Its active run is cancelled first.' : ''),
      confirm: 'Delete thread',
    });
    if (!ok || signal.aborted) return;
    await deleteWithStatus(t.thread_id, busy, note, signal, refresh);
  }

  filter.addEventListener('submit', (e) => {
    e.preventDefault();
    page = 0;
    refresh();
  });
  status.addEventListener('change', () => { page = 0; refresh(); });
  prev.addEventListener('click', () => { page = Math.max(0, page - 1); refresh(); });
  next.addEventListener('click', () => { page += 1; refresh(); });

  append(main, title('Threads'),
    section('new-run-h', 'Start a run', runForm({ signal })),
    h('section', { class: 'panel', 'aria-labelledby': 'threads-h' },
      h('div', { class: 'section-head' }, h('h3', { id: 'threads-h' }, 'Threads'),
        h('button', { type: 'button', id: 'threads-refresh', onclick: refresh }, 'Refresh')),
      filter, note, list,
      h('nav', { class: 'pager', 'aria-label': 'Pages of threads' }, prev, ' ', where, ' ', next)));
  return refresh();
}

// deleteWithStatus deletes a thread the person confirmed deleting, says
// how it went in note, and calls done once the thread is gone. A thread
// that became busy meanwhile is offered again with its run cancelled
// first.
async function deleteWithStatus(thread, cancel, note, signal, done) {
  note.textContent = `Deleting thread ${thread}…`;
  try {
    await deleteThread(thread, { cancel, signal });
    note.textContent = `Deleted thread ${thread}.`;
  } catch (err) {
    if (signal.aborted) return;
    if (err.status !== 404) {
      const parts = [errorBox(err)];
      if (err.status === 409 && err.code === 'busy' && !cancel) {
        parts.push(h('button', { type: 'button', id: 'delete-cancel-run', class: 'danger',
          onclick: () => deleteWithStatus(thread, true, note, signal, done) }, 'Cancel its run and delete'));
      }
      fill(note, parts);
      return;
    }
    note.textContent = `Thread ${thread} was already gone.`;
  }
  done();
}

function threadsTable(threads, filtered, remove) {
  if (!threads.length) {
    return h('p', { class: 'muted' }, filtered ? 'No thread matches.' : 'No threads yet: start a run above.');
  }
  return h('div', { class: 'table-wrap' }, h('table', { class: 'list', id: 'threads-table' },
    h('thead', {}, h('tr', {}, ['Thread', 'Status', 'Updated', 'Last run', ''].map((c) => h('th', { scope: 'col' }, c)))),
    h('tbody', {}, threads.map((t) => h('tr', { 'data-thread-id': t.thread_id },
      h('td', {}, h('a', { href: threadHash(t.thread_id) }, t.title || t.thread_id),
        t.title ? h('div', { class: 'muted' }, h('code', {}, t.thread_id)) : null),
      h('td', {}, statusBadge(t.status)),
      h('td', {}, timeEl(t.updated_at)),
      h('td', {}, t.last_run_id ? h('a', { href: runHash(t.thread_id, t.last_run_id) }, h('code', {}, t.last_run_id)) : '–'),
      h('td', {}, h('button', { type: 'button', class: 'danger delete-thread', 'aria-label': `Delete thread ${t.thread_id}`,
        onclick: () => remove(t) }, 'Delete')))))));
}

function runsTable(thread) {
  return (runs) => {
    if (!runs.length) return h('p', { class: 'muted' }, 'No runs.');
    return h('div', { class: 'table-wrap' }, h('table', { class: 'list', id: 'runs-table' },
      h('thead', {}, h('tr', {}, ['Run', 'Status', 'Created', 'Note'].map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, runs.map((r, i) => h('tr', { 'data-run-id': r.run_id },
        h('td', {}, h('a', { href: runHash(thread, r.run_id) }, h('code', {}, r.run_id))),
        h('td', {}, statusBadge(r.status)),
        h('td', {}, timeEl(r.created_at)),
        h('td', { class: 'run-note' }, runNote(r, i > 0 ? runs[i - 1] : null)))))));
  };
}

// runNote says why a run ended as it did. An interrupted run waits for a
// person only while no run came after it on the thread (newer is the
// next run, the list being newest first); after one, it was answered.
function runNote(r, newer) {
  if (r.stop_reason || r.error) return r.stop_reason || r.error;
  if (r.interrupt) {
    return newer ? ['answered: run ', h('a', { href: runHash(r.thread_id, newer.run_id) }, h('code', {}, newer.run_id)), ' came after it']
      : `waits for ${r.interrupt.kind}`;
  }
  return r.superseded_by ? `replaced by ${r.superseded_by}` : '';
}

function transcript(st) {
  const msgs = (st.values && st.values.messages) || [];
  const todos = st.values && st.values.todos;
  const out = [];
  if (Array.isArray(todos) && todos.length) {
    out.push(h('h4', {}, 'Todos'), h('ul', { class: 'todos' }, todos.map((t) => h('li', { 'data-status': t.status },
      h('span', { class: 'todo-status' }, (t.status || '').replace('_', ' ')), ' ', t.content))));
  }
  if (!msgs.length) {
    out.push(h('p', { class: 'muted' }, 'No messages yet.'));
    return out;
  }
  const who = { user: 'You', assistant: 'Assistant', tool: 'Tool', system: 'System' };
  out.push(h('ol', { class: 'timeline', id: 'transcript' }, msgs.map((m) => h('li', { class: `message ${m.role}` },
    h('div', { class: 'who' }, who[m.role] || m.role, m.name ? [' ', h('code', {}, m.name)] : null,
      m.meta && m.meta.run_id ? [' · ', h('a', { href: runHash(st.thread_id, m.meta.run_id), class: 'muted' }, 'run')] : null),
    m.role === 'tool' ? h('pre', { class: 'tool-result' }, clipText(textOf(m.content))) : h('div', { class: 'text' }, textOf(m.content)),
    (m.tool_calls || []).map((c) => h('div', { class: 'call' }, '→ ', h('code', {}, c.name), ' ', h('code', { class: 'muted' }, clipText(c.arguments, 300))))))));
  return out;
}

function clipText(s, n = 2000) {
  s = s || '';
  return s.length > n ? s.slice(0, n) + '…' : s;
}

function usageFacts(u) {
  const t = u.total || {};
  return h('dl', { class: 'facts' },
    h('dt', {}, 'Input'), h('dd', {}, num(t.input_tokens || 0)),
    h('dt', {}, 'Output'), h('dd', {}, num(t.output_tokens || 0)),
    h('dt', {}, 'Total'), h('dd', {}, num(t.total_tokens || 0)),
    h('dt', {}, 'Model calls'), h('dd', {}, num(t.calls || 0)));
}

function filesPanel(thread, signal) {
  const list = h('div', { id: 'files' }, h('p', { class: 'muted' }, 'Loading…'));
  const status = h('p', { role: 'status', id: 'files-status' });
  const refresh = async () => {
    try {
      const files = await getJSON(paths.files(thread), { signal });
      if (!files.length) { fill(list, h('p', { class: 'muted' }, 'No files.')); return; }
      fill(list, h('ul', { class: 'files' }, files.map((f) => h('li', {},
        h('code', {}, f.path), ` (${num(f.size)} bytes) `,
        h('button', { type: 'button', 'aria-label': `Download ${f.path}`, onclick: () => download(thread, f.path, signal).catch((err) => fill(status, errorBox(err))) }, 'Download')))));
    } catch (err) {
      if (signal.aborted) return;
      fill(list, err.status === 404 && err.code === 'not_found' ? h('p', { class: 'muted' }, err.message) : errorBox(err));
    }
  };
  const input = h('input', { type: 'file', id: 'upload-input', multiple: true });
  const form = h('form', { class: 'inline-form' }, field('Attach files (stored under /uploads)', input),
    h('button', { type: 'submit' }, 'Upload'));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    if (!input.files.length) { fill(status, errorBox('Choose a file first.')); return; }
    status.textContent = 'Uploading…';
    try {
      const stored = await upload(thread, input.files, signal);
      status.textContent = `Stored ${stored.map((f) => f.path).join(', ')}.`;
      form.reset();
      refresh();
    } catch (err) {
      if (!signal.aborted) fill(status, errorBox(err));
    }
  });
  refresh();
  return [list, form, status];
}

async function threadView(thread, signal) {
  document.title = `Thread ${thread} · natsagent`;
  const head = title(`Thread ${thread}`);
  const info = h('p', { id: 'thread-info', class: 'muted' });
  const runs = h('div', { id: 'runs' }, h('p', { class: 'muted' }, 'Loading…'));
  const conv = h('div', { id: 'conversation' }, h('p', { class: 'muted' }, 'Loading…'));
  const usage = h('div', { id: 'thread-usage' });
  const note = h('p', { id: 'thread-note', role: 'status' });
  const del = h('button', { type: 'button', id: 'delete-thread', class: 'danger' }, 'Delete thread');
  del.addEventListener('click', async () => {
    const ok = await confirmAction({
      title: 'Delete this thread?',
      text: `Thread ${thread}, with its messages, runs, files and token usage, is deleted for good.`,
      confirm: 'Delete thread',
    });
    if (ok && !signal.aborted) await deleteWithStatus(thread, false, note, signal, () => go('#/'));
  });
  append(main, head, info, h('div', { class: 'buttons' }, del), note,
    h('div', { class: 'run-grid' },
      h('div', { class: 'run-main' },
        section('send-h', 'Send a message', runForm({ thread, signal })),
        section('conv-h', 'Conversation', conv)),
      h('aside', { class: 'run-side', 'aria-label': 'Thread details' },
        section('runs-h', 'Runs', runs),
        section('files-h', 'Files', filesPanel(thread, signal)),
        section('thread-usage-h', 'Token usage', usage))));
  try {
    const th = await getJSON(paths.thread(thread), { signal });
    if (th.title) fill(head, th.title);
    fill(info, h('code', {}, th.thread_id), ' · ', statusBadge(th.status), ' · updated ', timeEl(th.updated_at),
      th.active_run_id ? [' · running ', h('a', { href: runHash(thread, th.active_run_id) }, th.active_run_id)] : null);
  } catch (err) {
    if (signal.aborted) return;
    if (err.status === 404) {
      fill(info, 'This thread has no record yet: send a message to start it.');
    } else {
      fill(info, errorBox(err));
    }
    fill(runs, ''); fill(conv, ''); return;
  }
  await Promise.all([
    load(runs, paths.runs(thread), signal, runsTable(thread)),
    load(conv, paths.state(thread), signal, transcript),
    load(usage, paths.threadUsage(thread), signal, usageFacts),
  ]);
}

function newRunView(signal) {
  document.title = 'New run · natsagent';
  append(main, title('New run'), section('new-run-h', 'Start a run', runForm({ signal })));
}

// --- routing ---

let current = null;

async function route(focus) {
  if (current) current.abort();
  current = new AbortController();
  const { signal } = current;
  main.replaceChildren();
  const hash = location.hash || '#/';
  const dec = decodeURIComponent;
  let m;
  try {
    if (!hash.match(/^#\/threads\/[^/]+\/runs\/[^/]+$/)) takeHanded();
    if (hash === '#/' || hash === '#' || hash.startsWith('#/?')) {
      const p = threadsView(signal, new URLSearchParams(hash.startsWith('#/?') ? hash.slice(3) : ''));
      if (focus) main.querySelector('h2').focus();
      await p;
    } else if (hash === '#/new') {
      newRunView(signal);
      if (focus) main.querySelector('h2').focus();
    } else if ((m = hash.match(/^#\/threads\/([^/]+)\/runs\/([^/]+)$/))) {
      const p = renderRun(main, { thread: dec(m[1]), run: dec(m[2]) }, signal, go);
      if (focus) main.querySelector('h2').focus();
      await p;
    } else if ((m = hash.match(/^#\/threads\/([^/]+)$/))) {
      const p = threadView(dec(m[1]), signal);
      if (focus) main.querySelector('h2').focus();
      await p;
    } else {
      append(main, title('Not found'), h('p', {}, 'Nothing here. ', h('a', { href: '#/' }, 'See the threads.')));
    }
  } catch (err) {
    if (!signal.aborted) append(main, errorBox(err));
  }
}

document.getElementById('skip-link').addEventListener('click', (e) => {
  e.preventDefault();
  main.focus();
});
window.addEventListener('hashchange', () => route(true));
showKeyState();
route(false);
