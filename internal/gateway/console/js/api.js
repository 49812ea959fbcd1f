// The gateway's HTTP API, as docs/protocol.md section 3 describes it. The
// API key lives in sessionStorage (this tab, until it closes) and travels
// only in the Authorization header, never in a URL. Event streams are read
// with fetch rather than EventSource, which can send neither headers nor
// POST.

const keyItem = 'natsagent.console.key';
const tenantItem = 'natsagent.console.tenant';

export class APIError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `the gateway answered HTTP ${status}`);
    this.status = status;
    this.code = e.code || '';
    this.field = e.field || '';
  }
}

export function settings() {
  return {
    key: sessionStorage.getItem(keyItem) || '',
    tenant: sessionStorage.getItem(tenantItem) || '',
  };
}

export function saveSettings({ key, tenant }) {
  for (const [item, v] of [[keyItem, key], [tenantItem, tenant]]) {
    if (v) sessionStorage.setItem(item, v);
    else sessionStorage.removeItem(item);
  }
}

// askKey is called on a 401 with the gateway's reason; it resolves true
// once a new key is saved, false if the person declined. The app sets it.
let askKey = async () => false;

export function onKeyNeeded(fn) {
  askKey = fn;
}

async function errorOf(resp) {
  let body = null;
  try {
    body = await resp.json();
  } catch {
    // not the API's JSON error (a proxy's page): the status says enough
  }
  return new APIError(resp.status, body);
}

// request sends one API request and returns the response once it is OK;
// a 401 asks for a key and tries again.
// raw is a body sent as it is (a FormData sets its own content type).
export async function request(method, path, { body, raw, signal, accept = 'application/json', headers = {} } = {}) {
  for (let attempt = 0; ; attempt++) {
    const { key, tenant } = settings();
    const h = { Accept: accept, ...headers };
    if (key) h.Authorization = `Bearer ${key}`;
    if (tenant) h['X-Tenant'] = tenant;
    const init = { method, headers: h, signal, cache: 'no-store', credentials: 'omit', redirect: 'error' };
    if (body !== undefined) {
      h['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    } else if (raw !== undefined) {
      init.body = raw;
    }
    const resp = await fetch(path, init);
    if (resp.ok) return resp;
    const err = await errorOf(resp);
    if (resp.status === 401 && attempt < 5 && (await askKey(err.message))) continue;
    throw err;
  }
}

export async function getJSON(path, opts) {
  return (await request('GET', path, opts)).json();
}

export async function postJSON(path, body, opts) {
  return (await request('POST', path, { ...opts, body })).json();
}

// deleteThread deletes a thread and everything keyed by it (protocol.md
// 2.20); cancel stops its active run first.
export async function deleteThread(thread, { cancel = false, signal } = {}) {
  await request('DELETE', paths.thread(thread) + (cancel ? '?cancel=true' : ''), { signal });
}

const seg = encodeURIComponent;

export const paths = {
  threadSearch: () => '/threads/search',
  thread: (t) => `/threads/${seg(t)}`,
  state: (t) => `/threads/${seg(t)}/state?format=natsagent`,
  runs: (t) => `/threads/${seg(t)}/runs?limit=100`,
  latestRun: (t) => `/threads/${seg(t)}/runs?limit=1`,
  createStream: (t) => `/threads/${seg(t)}/runs/stream`,
  run: (t, r) => `/threads/${seg(t)}/runs/${seg(r)}`,
  // natsagent's own events: without stream_mode the gateway sends
  // LangGraph's values.
  stream: (t, r) => `/threads/${seg(t)}/runs/${seg(r)}/stream?stream_mode=natsagent`,
  cancel: (t, r) => `/threads/${seg(t)}/runs/${seg(r)}/cancel`,
  threadUsage: (t) => `/threads/${seg(t)}/usage`,
  files: (t) => `/threads/${seg(t)}/files`,
  // A workdir path is absolute; its segments are encoded one by one.
  file: (t, p) => `/threads/${seg(t)}/files/${p.split('/').filter(Boolean).map(seg).join('/')}`,
  uploads: (t) => `/threads/${seg(t)}/uploads`,
};

// readSSE yields the {id, event, data} frames of an event stream
// response until the gateway ends it.
export async function* readSSE(resp) {
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  let frame = { id: '', event: '', data: [] };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += value;
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        let line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (line.endsWith('\r')) line = line.slice(0, -1);
        if (line === '') {
          if (frame.data.length) yield { id: frame.id, event: frame.event, data: frame.data.join('\n') };
          frame = { id: '', event: '', data: [] };
          continue;
        }
        if (line.startsWith(':')) continue; // keep-alive comment
        const colon = line.indexOf(':');
        const name = colon < 0 ? line : line.slice(0, colon);
        let v = colon < 0 ? '' : line.slice(colon + 1);
        if (v.startsWith(' ')) v = v.slice(1);
        if (name === 'data') frame.data.push(v);
        else if (name === 'id') frame.id = v;
        else if (name === 'event') frame.event = v;
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

// events reads a run's event stream from after lastEventID ('' for the
// start) and yields {id, event, data} until the gateway ends the stream.
export async function* events(thread, run, lastEventID, signal, onOpen) {
  const headers = lastEventID ? { 'Last-Event-ID': lastEventID } : {};
  const resp = await request('GET', paths.stream(thread, run), { signal, accept: 'text/event-stream', headers });
  // The gateway answers once it follows the run: live events (token
  // deltas) published from now on reach this stream, earlier ones never do.
  if (onOpen) onOpen();
  yield* readSSE(resp);
}

// createAndStream submits a run and returns the open response of its
// events (docs/protocol.md 3.5): the gateway follows the run before it
// publishes it, so not one token delta is missed, however quick the run.
// An error before the stream starts (400, 409, ...) is thrown.
export function createAndStream(thread, body, signal) {
  return request('POST', paths.createStream(thread), {
    body: { ...body, stream_mode: 'natsagent' }, signal, accept: 'text/event-stream',
  });
}

// download fetches a workdir file with the key and hands it to the browser
// as a file to save.
export async function download(thread, filePath, signal) {
  const resp = await request('GET', paths.file(thread, filePath), { signal, accept: '*/*' });
  const blob = await resp.blob();
  const url = URL.createObjectURL(blob);
  const a = document.createElement('a');
  a.href = url;
  a.download = filePath.split('/').pop() || 'file';
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// upload stores files under /uploads of a thread's workdir.
export async function upload(thread, fileList, signal) {
  const form = new FormData();
  for (const f of fileList) form.append('file', f, f.name);
  return (await request('POST', paths.uploads(thread), { raw: form, signal })).json();
}
