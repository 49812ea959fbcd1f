// DOM helpers. Text from the API is only ever set as text (never as HTML),
// so nothing a model or a user wrote can become markup in the page.

// h builds an element: h('a', {href: '#/'}, 'Threads'). Attributes named
// on* take listeners (onclick: fn); class, for and the boolean attributes
// map as in HTML; children are nodes, strings, or arrays of them.
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') {
      el.addEventListener(k.slice(2), v);
    } else if (k === 'dataset') {
      Object.assign(el.dataset, v);
    } else if (v === true) {
      el.setAttribute(k, '');
    } else {
      el.setAttribute(k, String(v));
    }
  }
  append(el, ...children);
  return el;
}

export function append(el, ...children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

// clear empties an element, then appends children.
export function fill(el, ...children) {
  el.replaceChildren();
  return append(el, ...children);
}

let counter = 0;

// uid returns an element id unique in the page.
export function uid(prefix) {
  counter += 1;
  return `${prefix}-${counter}`;
}

// field is a label and its control, tied by id.
export function field(label, control, hint) {
  if (!control.id) control.id = uid('f');
  const parts = [h('label', { for: control.id }, label), control];
  if (hint) {
    const hintEl = h('small', { id: control.id + '-hint', class: 'hint' }, hint);
    control.setAttribute('aria-describedby', hintEl.id);
    parts.push(hintEl);
  }
  return h('div', { class: 'field' }, parts);
}

export function when(s) {
  if (!s) return '';
  const d = new Date(s);
  return Number.isNaN(d.getTime()) ? String(s) : d.toLocaleString();
}

export function timeEl(s) {
  return s ? h('time', { datetime: s }, when(s)) : '';
}

// clock is an event's time of day to the second, with the whole date and
// time in its tooltip.
export function clock(s) {
  if (!s) return '';
  const d = new Date(s);
  if (Number.isNaN(d.getTime())) return '';
  return h('time', { class: 'clock', datetime: d.toISOString(), title: d.toLocaleString() },
    d.toLocaleTimeString(undefined, { hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false }));
}

export function num(n) {
  return typeof n === 'number' ? n.toLocaleString() : '–';
}

// pretty formats JSON text (or a value) for a <pre>; text that is not JSON
// is shown as it is.
export function pretty(v) {
  if (typeof v === 'string') {
    try {
      return JSON.stringify(JSON.parse(v), null, 2);
    } catch {
      return v;
    }
  }
  return JSON.stringify(v, null, 2);
}

// compact is a one-line rendering of an event's data for the logs.
export function compact(v) {
  if (v === undefined || v === null) return '';
  const s = JSON.stringify(v);
  return s.length > 400 ? s.slice(0, 400) + '…' : s;
}

// knownStatuses are the run and thread statuses the stylesheet colours;
// any other status a newer gateway sends is shown as it is, in a neutral
// style.
const knownStatuses = new Set(['pending', 'running', 'success', 'error', 'cancelled', 'interrupted', 'steered', 'incomplete',
  'rejected', 'timeout', 'idle', 'busy', 'deleting']);

export function statusClass(status) {
  return knownStatuses.has(status) ? `status-${status}` : 'status-other';
}

export function statusBadge(status) {
  return h('span', { class: `badge ${statusClass(status)}`, 'data-status': status || '' }, status || 'unknown');
}

// errorBox shows an error a person can act on.
export function errorBox(err) {
  const msg = err && err.message ? err.message : String(err);
  return h('p', { class: 'error', role: 'alert' }, msg);
}

const alphabet = 'abcdefghijklmnopqrstuvwxyz234567';

// newID returns an id like the gateway's: 26 lower-case base32 characters.
// Runs get their id from the page, so a retried submission is one run.
export function newID() {
  const bytes = crypto.getRandomValues(new Uint8Array(26));
  return Array.from(bytes, (b) => alphabet[b & 31]).join('');
}

export const idPattern = '[A-Za-z0-9_\\-]{1,128}';

// confirmAction asks the person to confirm something that cannot be
// undone, in a modal dialog; it resolves true when they confirmed.
export function confirmAction({ title, text, confirm }) {
  const yes = h('button', { type: 'button', id: 'confirm-yes', class: 'danger' }, confirm);
  const no = h('button', { type: 'button', id: 'confirm-no' }, 'Keep it');
  const dialog = h('dialog', { id: 'confirm-dialog', 'aria-labelledby': 'confirm-title', 'aria-describedby': 'confirm-text' },
    h('h2', { id: 'confirm-title' }, title),
    h('p', { id: 'confirm-text' }, text),
    h('div', { class: 'buttons' }, yes, no));
  yes.addEventListener('click', () => dialog.close('yes'));
  no.addEventListener('click', () => dialog.close(''));
  document.body.append(dialog);
  return new Promise((resolve) => {
    dialog.addEventListener('close', () => {
      resolve(dialog.returnValue === 'yes');
      dialog.remove();
    }, { once: true });
    dialog.showModal();
    no.focus();
  });
}
