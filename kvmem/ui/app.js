// The memory page: a thin client of kvmem's REST API (/memory, /memory/proposals,
// /memory/scopes, /preferences, /sessions).
// It has no rules of its own: every check is the server's, and its message is shown as is.
// Everything that came from a person or a model is written with textContent, never as HTML.
// It shows one layer at a time: the person's own memory or one of their scopes (section 23);
// every /memory call it makes names the layer shown.

const TOKEN_STORAGE = "kvmem.token";
const UNDO_MS = 10_000;

const $ = (id) => document.getElementById(id);
// Facts of the server's config that the page needs before any request: whether it must ask
// for a key first (auth.mode) and whether users may switch memory off (memory.personalize).
const server = {
  needsKey: document.body.dataset.authMode === "keys",
  personalize: document.body.dataset.personalize === "true",
  // memory.review: only under per_user does each person choose whether the agent asks first.
  reviewPerUser: document.body.dataset.review === "per_user",
  // memory.scopes: the switcher between the person's own memory and each of their scopes.
  scopes: document.body.dataset.scopes === "true",
};
const state = {
  token: null,
  overview: null,
  editing: null, // the key being edited, or null when adding
  undo: null, // {key, value, timer}
  historyKey: null,
  historyScope: null, // the layer of historyKey
  scope: null, // the layer shown: null for the person's own memory, else a scope's name
  scopes: [], // the person's scopes that hold entries, by name
  switching: 0, // counts switches, so that only the latest one's answers are shown
};

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// --- the API ---------------------------------------------------------------------------

async function api(method, path, body) {
  const headers = {};
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  const init = { method, headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = typeof body === "string" ? body : JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch {
    throw new ApiError(0, "network", "kvmem cannot be reached. Check that the server is running.");
  }
  if (response.status === 204) return null;
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const error = data && data.error;
    if (response.status === 401 && state.token) {
      // The session ended or expired while the page was open: ask again.
      sessionStorage.removeItem(TOKEN_STORAGE);
      state.token = null;
      showSignIn(error ? error.message : "");
    }
    throw new ApiError(
      response.status,
      error ? error.code : "http_error",
      error && error.message ? error.message : `The server answered ${response.status}.`,
    );
  }
  return data;
}

// `path` on the layer `scope`: `?scope=NAME` for a scope, as it is for the person's own memory.
function inLayer(path, scope = state.scope) {
  if (scope === null) return path;
  return `${path}${path.includes("?") ? "&" : "?"}scope=${encodeURIComponent(scope)}`;
}

// `/memory/KEY` (and what follows it, `rest`) on the layer `scope`.
const keyPath = (key, rest = "", scope = state.scope) => inLayer(`/memory/${encodeURIComponent(key)}${rest}`, scope);

// --- small view helpers ----------------------------------------------------------------

function element(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (name === "text") node.textContent = value;
    else if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value);
  }
  node.append(...children);
  return node;
}

function showMessage(node, message) {
  node.textContent = message || "";
  node.hidden = !message;
}

// Building these loads locale data (tens of ms in a fresh tab), so it is done while the
// first API requests are in flight, not before they are sent.
let formats = null;
function format() {
  formats ??= {
    relative: new Intl.RelativeTimeFormat(undefined, { numeric: "auto" }),
    exact: new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "medium" }),
  };
  return formats;
}
const STEPS = [
  ["year", 365 * 86400],
  ["month", 30 * 86400],
  ["week", 7 * 86400],
  ["day", 86400],
  ["hour", 3600],
  ["minute", 60],
];

function relativeTime(iso) {
  const seconds = (Date.parse(iso) - Date.now()) / 1000;
  if (Math.abs(seconds) < 45) return "just now";
  for (const [unit, size] of STEPS) {
    if (Math.abs(seconds) >= size || unit === "minute") {
      return format().relative.format(Math.round(seconds / size), unit);
    }
  }
  return "just now";
}

function timeElement(iso) {
  return element("time", { datetime: iso, title: format().exact.format(new Date(iso)), text: relativeTime(iso) });
}

function refreshTimes() {
  for (const node of document.querySelectorAll("time[datetime]")) {
    node.textContent = relativeTime(node.getAttribute("datetime"));
  }
}

const SOURCE_HINTS = {
  manual: "Written by hand (this page, the API or the CLI)",
  agent: "Saved by the memory agent during a chat",
  import: "Imported from a file",
  revert: "Restored from the history",
  mcp: "Written by an MCP client",
};

const plural = (n, one, many) => `${n} ${n === 1 ? one : many}`;

// --- signing in (keys mode) ------------------------------------------------------------

// The token a link carries in the page's fragment: {token}, {malformed: true} when it
// cannot be decoded, or null when there is none.
function tokenFromFragment() {
  const match = /(?:^#|&)token=([^&]*)/.exec(location.hash);
  if (!match) return null;
  // The token must not stay in the address bar, the history or a bookmark.
  history.replaceState(null, "", location.pathname + location.search);
  try {
    return { token: decodeURIComponent(match[1]) };
  } catch {
    return { malformed: true };
  }
}

const MALFORMED_LINK =
  "The link's token could not be read: it is cut short or mistyped. " +
  "Open the link again from where you found it, or paste a key or token.";

// The user a token acts for, from the export document (the one answer that names its
// user); null when the server refuses the token or cannot be reached.
async function ownerOf(token) {
  try {
    const response = await fetch("/memory/export", { headers: { Authorization: `Bearer ${token}` } });
    return response.ok ? (await response.json()).user : null;
  } catch {
    return null;
  }
}

// A link's token replaces the one in use, but one for another user only if the person
// says so: a link from someone else must not silently sign them in as someone else.
// Returns the message the page should show ("" when there is none).
async function adoptLinkToken(link) {
  if (!link) return "";
  if (link.malformed) return MALFORMED_LINK;
  const current = sessionStorage.getItem(TOKEN_STORAGE);
  if (current && current !== link.token) {
    const [signedIn, linked] = await Promise.all([ownerOf(current), ownerOf(link.token)]);
    const another = signedIn !== null && linked !== null && signedIn !== linked;
    if (another && !(await confirmSwitch(signedIn, linked))) return "";
  }
  sessionStorage.setItem(TOKEN_STORAGE, link.token);
  return "";
}

function confirmSwitch(signedIn, linked) {
  const dialog = $("switch-dialog");
  $("switch-text").textContent =
    `You are signed in as “${signedIn}”. This link would sign you in as “${linked}” instead.`;
  $("switch-cancel").textContent = `Stay signed in as ${signedIn}`;
  $("switch-confirm").textContent = `Switch to ${linked}`;
  dialog.returnValue = "";
  return new Promise((resolve) => {
    // Escape, like Stay, closes it with no "switch".
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "switch"), { once: true });
    dialog.showModal();
  });
}

function showSignIn(message) {
  $("app").hidden = true;
  $("page-state").hidden = true;
  $("sign-out").hidden = true;
  $("sign-in").hidden = false;
  showMessage($("sign-in-error"), message);
  $("sign-in-token").focus();
}

async function signIn(event) {
  event.preventDefault();
  const token = $("sign-in-token").value.trim();
  if (!token) {
    showMessage($("sign-in-error"), "Paste a key or a session token.");
    return;
  }
  state.token = token;
  sessionStorage.setItem(TOKEN_STORAGE, token);
  $("sign-in-token").value = "";
  await start();
}

async function signOut() {
  if (state.token) {
    // Ends the token on the server when it is a session; a key just stays with its owner.
    await api("DELETE", "/sessions/current").catch(() => null);
  }
  sessionStorage.removeItem(TOKEN_STORAGE);
  state.token = null;
  showSignIn("");
}

// --- loading and rendering -------------------------------------------------------------

// `notice`: a message about how the page was opened (a malformed link), shown with the rest.
async function start(notice = "") {
  if (server.needsKey && !state.token) {
    showSignIn(notice);
    return;
  }
  // Scopes are the user's own: whoever signs in starts on their own memory, and a switch
  // still under way for the one before shows nothing.
  state.scope = null;
  state.switching += 1;
  try {
    const loading = Promise.all([
      api("GET", "/memory"),
      loadPreferences(),
      api("GET", "/memory/proposals"),
      loadScopes(),
    ]);
    format();
    const [overview, preferences, { proposals }, scopes] = await loading;
    $("sign-in").hidden = true;
    $("page-state").hidden = true;
    $("app").hidden = false;
    $("sign-out").hidden = !state.token;
    toggleNewScope(false);
    renderScopes(scopes);
    renderOverview(overview);
    renderPreferences(preferences);
    renderProposals(proposals);
    showMessage($("page-error"), notice);
    performance.mark("kvmem:rendered");
  } catch (error) {
    if (error.status === 401) {
      // api() has dropped the refused token; without one, the sign-in form says why.
      showSignIn(error.message);
    } else {
      $("app").hidden = true;
      $("page-state").hidden = false;
      $("page-state").textContent =
        error.code === "memory_disabled" ? "Memory is turned off on this server." : error.message;
    }
  }
}

async function loadPreferences() {
  const preferences = await api("GET", "/preferences");
  return { ...preferences, switchable: server.personalize };
}

// The layer shown, read again; dropped if the person switched to another meanwhile.
async function reload() {
  const scope = state.scope;
  const overview = await api("GET", inLayer("/memory", scope));
  if (scope === state.scope) renderOverview(overview);
}

function renderOverview(overview) {
  state.overview = overview;
  renderLayer();
  renderUsage(overview);
  renderKeyField(overview.valid_keys);
  const list = $("entries");
  const items = document.createDocumentFragment();
  for (const entry of overview.memories) items.append(entryItem(entry));
  list.replaceChildren(items);
  list.setAttribute("aria-busy", "false");
  const count = overview.memories.length;
  $("entries-count").textContent = count ? `(${count})` : "";
  $("empty").hidden = count > 0;
  renderEmpty();
  $("clear-all").disabled = count === 0;
}

// An empty list says how memory gets there: the assistant, asked in a chat, or this page;
// with memory off for this user's chats, only this page, until it is switched on.
function renderEmpty() {
  const nothing = state.scope === null ? "Nothing is remembered yet." : `Nothing is remembered in \u201c${state.scope}\u201d yet.`;
  let how;
  if (!state.overview.enabled) {
    how = "Memory is off for your chats, so the assistant remembers nothing you tell it: switch on \u201cUse memory in chats\u201d, or add a memory above.";
  } else if (state.scope !== null) {
    how = "The assistant saves here what a chat in this scope asks it to remember, or add a memory above.";
  } else {
    how = "Ask the assistant in a chat to remember something (\u201cremember that I prefer tea\u201d), or add a memory above.";
  }
  $("empty").textContent = `${nothing} ${how}`;
}

// --- scopes: the person's own memory or one of their scopes, one at a time --------------

// The names of the person's scopes that hold entries; none when the server keeps no scopes
// (asking it would only be refused).
async function loadScopes() {
  if (!server.scopes) return [];
  const { scopes } = await api("GET", "/memory/scopes");
  return scopes.map((layer) => layer.scope);
}

// The switcher: "My memory", then each scope by name, the one shown among them even while
// it holds nothing (a new one, or one just cleared).
function renderScopes(names) {
  state.scopes = names;
  const shown = state.scope === null || names.includes(state.scope) ? names : [...names, state.scope].sort();
  $("layer-select").replaceChildren(
    element("option", { value: "", text: "My memory" }),
    ...shown.map((name) => element("option", { value: name, text: name })),
  );
  // A scope is never "" (1-128 characters), so "" stands for the person's own memory.
  $("layer-select").value = state.scope ?? "";
  $("layer").hidden = !server.scopes;
}

// What depends on the layer shown besides its entries: the switcher's hint, the clear dialog.
function renderLayer() {
  if (!server.scopes) return;
  const scope = state.scope;
  $("layer-hint").textContent =
    scope === null
      ? "Your own memory: every chat sees it. A scope keeps memories apart for one assistant, model or project."
      : `Only chats in the scope \u201c${scope}\u201d see these memories; other chats and scopes never do.`;
  $("clear-title").textContent = scope === null ? "Clear all memories?" : `Clear all memories in \u201c${scope}\u201d?`;
  $("clear-text").textContent =
    scope === null
      ? "Every memory of your own, its history and the suggested memories will be deleted; your scopes keep theirs. This cannot be undone."
      : "Every memory in this scope, its history and its suggested memories will be deleted; your own memory and your other scopes stay. This cannot be undone.";
}

// Show the layer `scope` (null: the person's own memory). Throws the server's refusal (a
// malformed name) with nothing changed.
async function switchLayer(scope) {
  const ticket = ++state.switching;
  showMessage($("layer-error"), "");
  $("entries").setAttribute("aria-busy", "true");
  let answers;
  try {
    answers = await Promise.all([
      api("GET", inLayer("/memory", scope)),
      api("GET", inLayer("/memory/proposals", scope)),
      loadScopes(),
    ]);
  } catch (error) {
    if (ticket === state.switching) {
      $("layer-select").value = state.scope ?? "";
      $("entries").setAttribute("aria-busy", "false");
    }
    throw error;
  }
  if (ticket !== state.switching) return; // a later switch shows its own layer
  const [overview, { proposals }, names] = answers;
  // What was begun on the other layer ends with it; a new entry's typed text stays.
  if (state.editing !== null) endEdit();
  clearUndo();
  if ($("history-dialog").open) $("history-dialog").close();
  showMessage($("page-error"), "");
  showMessage($("suggestions-error"), "");
  state.scope = scope;
  renderScopes(names);
  renderOverview(overview);
  renderProposals(proposals);
}

async function chooseLayer() {
  const value = $("layer-select").value;
  try {
    await switchLayer(value === "" ? null : value);
  } catch (error) {
    showMessage($("layer-error"), error.message);
  }
}

function toggleNewScope(open) {
  $("new-scope-form").hidden = !open;
  $("new-scope").setAttribute("aria-expanded", String(open));
  showMessage($("new-scope-error"), "");
  if (open) {
    $("new-scope-name").focus();
  } else {
    $("new-scope-name").value = "";
  }
}

// A scope by its name: one of the person's, or a new, empty one that is kept once it holds
// a memory. The server says whether the name is one.
async function openScope(event) {
  event.preventDefault();
  const name = $("new-scope-name").value.trim();
  if (!name) {
    showMessage($("new-scope-error"), "Enter a scope name.");
    $("new-scope-name").focus();
    return;
  }
  try {
    await switchLayer(name);
  } catch (error) {
    showMessage($("new-scope-error"), error.message);
    $("new-scope-name").focus();
    return;
  }
  toggleNewScope(false);
  $("layer-select").focus();
}

function renderUsage({ total_tokens: total, token_limit: limit, usage_percentage: percent }) {
  const bar = $("usage-bar");
  if (limit === null || limit === undefined) {
    // Without a limit there is nothing to measure against: no bar, just the count.
    bar.hidden = true;
    bar.removeAttribute("aria-valuenow");
    $("usage-text").textContent = `${plural(total, "token", "tokens")}, no limit`;
    return;
  }
  const shown = Math.min(percent, 100);
  bar.hidden = false;
  bar.setAttribute("aria-valuenow", String(percent));
  // Above 100 % when tokenLimit was lowered below what is stored; the range must hold it.
  bar.setAttribute("aria-valuemax", String(Math.max(100, percent)));
  bar.setAttribute("aria-valuetext", `${percent}% (${total} of ${limit} tokens)`);
  bar.classList.toggle("warn", percent >= 80 && percent < 100);
  bar.classList.toggle("full", percent >= 100);
  $("usage-fill").style.width = `${shown}%`;
  $("usage-text").textContent = `${total} of ${limit} tokens`;
}

function renderPreferences({ memories, review, switchable }) {
  $("review-setting").hidden = !server.reviewPerUser;
  $("review").checked = review;
  const box = $("use-memory");
  box.checked = memories;
  box.disabled = !switchable;
  $("use-memory-hint").textContent = switchable
    ? "When this is off, the assistant neither reads nor saves memories in your chats. You can still edit them here."
    : "This server uses memory in every chat: its administrator has turned off the option to switch it off (memory.personalize is false).";
}

function renderKeyField(validKeys) {
  const current = $("entry-key");
  const wantSelect = Array.isArray(validKeys) && validKeys.length > 0;
  const options = wantSelect ? validKeys.join("\n") : "";
  if (wantSelect === (current.tagName === "SELECT") && current.dataset.options === options) return;
  let field;
  if (wantSelect) {
    field = element("select", { id: "entry-key" }, element("option", { value: "", text: "Choose a key…" }));
    for (const key of validKeys) field.append(element("option", { value: key, text: key }));
    field.dataset.options = options;
  } else {
    field = element("input", {
      id: "entry-key",
      autocomplete: "off",
      spellcheck: "false",
      placeholder: "e.g. user_preferences",
    });
  }
  field.value = current.value;
  current.replaceWith(field);
}

function entryItem(entry) {
  const keyId = `memory-key-${entry.key}`;
  const meta = element(
    "p",
    { class: "meta" },
    element("span", { text: plural(entry.token_count, "token", "tokens") }),
    element("span", { class: `source source-${entry.source}`, title: SOURCE_HINTS[entry.source] || "", text: entry.source }),
    timeElement(entry.updated_at),
  );
  if (entry.expires_at) {
    // The day (UTC) the entry stops being remembered; its exact moment on hover.
    meta.append(element("span", { class: "until", title: format().exact.format(new Date(entry.expires_at)), text: `until ${entry.expires_at.slice(0, 10)}` }));
  }
  const actions = element(
    "div",
    { class: "actions" },
    element("button", { type: "button", class: "quiet", "aria-describedby": keyId, text: "Edit", onclick: () => beginEdit(entry) }),
    element("button", { type: "button", class: "quiet", "aria-describedby": keyId, text: "History", onclick: () => openHistory(entry.key) }),
    element("button", { type: "button", class: "quiet danger-text", "aria-describedby": keyId, text: "Delete", onclick: () => deleteEntry(entry) }),
  );
  return element(
    "li",
    { class: "entry" },
    element("div", { class: "entry-top" }, element("h3", { class: "key", id: keyId, text: entry.key }), meta),
    element("p", { class: "value", text: entry.value }),
    actions,
  );
}

// --- add and edit ----------------------------------------------------------------------

function beginEdit(entry) {
  state.editing = entry.key;
  const field = $("entry-key");
  if (field.tagName === "SELECT" && ![...field.options].some((o) => o.value === entry.key)) {
    // A key stored before validKeys changed: shown so that the server can say why it is refused.
    field.append(element("option", { value: entry.key, text: entry.key, "data-extra": "" }));
  }
  field.value = entry.key;
  field.disabled = field.tagName === "SELECT";
  field.readOnly = true;
  $("entry-value").value = entry.value;
  $("entry-expires").value = entry.expires_at ? entry.expires_at.slice(0, 10) : "";
  $("editing-note").textContent = `Editing “${entry.key}”. Saving replaces its value.`;
  $("editing-note").hidden = false;
  $("cancel-edit").hidden = false;
  showMessage($("form-error"), "");
  $("entry-value").focus();
  $("entry-form").scrollIntoView({ block: "nearest" });
}

function endEdit() {
  state.editing = null;
  const field = $("entry-key");
  for (const option of field.querySelectorAll("option[data-extra]")) option.remove();
  field.disabled = false;
  field.readOnly = false;
  field.value = "";
  $("entry-value").value = "";
  $("entry-expires").value = "";
  $("editing-note").hidden = true;
  $("cancel-edit").hidden = true;
  showMessage($("form-error"), "");
}

async function saveEntry(event) {
  event.preventDefault();
  const key = state.editing ?? $("entry-key").value.trim();
  const value = $("entry-value").value;
  if (!key) {
    showMessage($("form-error"), $("entry-key").tagName === "SELECT" ? "Choose a key." : "Enter a key.");
    $("entry-key").focus();
    return;
  }
  try {
    // A day is the end of that day, UTC; no day: the entry never expires.
    const expires = $("entry-expires").value;
    const result = await api("PUT", keyPath(key), expires ? { value, expires_at: expires } : { value });
    const editing = state.editing !== null;
    endEdit();
    await reload();
    announce(editing ? `Saved “${key}”.` : `Added “${key}” (${plural(result.memory.token_count, "token", "tokens")}).`);
    $("entry-key").focus();
  } catch (error) {
    // Nothing typed is lost: the fields keep their text until the write succeeds.
    showMessage($("form-error"), error.message);
  }
}

// --- delete and undo -------------------------------------------------------------------

function announce(message, ...extra) {
  if (state.undo && extra.length === 0) {
    // A newer message replaces an Undo offer; its timer must not clear that message later.
    clearTimeout(state.undo.timer);
    state.undo = null;
  }
  $("status").replaceChildren(element("span", { text: message }), ...extra);
}

async function deleteEntry(entry) {
  showMessage($("page-error"), "");
  try {
    await api("DELETE", keyPath(entry.key));
  } catch (error) {
    showMessage($("page-error"), error.message);
    return;
  }
  if (state.editing === entry.key) endEdit();
  offerUndo(entry);
  reload().catch((error) => showMessage($("page-error"), error.message));
}

function offerUndo(entry) {
  clearUndo();
  const undo = element("button", { type: "button", class: "link", text: "Undo", onclick: () => undoDelete(entry) });
  announce(`Deleted “${entry.key}”.`, undo);
  undo.focus();
  state.undo = {
    key: entry.key,
    timer: setTimeout(() => {
      const hadFocus = $("status").contains(document.activeElement);
      clearUndo();
      if (hadFocus) $("entries-title").focus();
    }, UNDO_MS),
  };
}

function clearUndo() {
  if (!state.undo) return;
  clearTimeout(state.undo.timer);
  state.undo = null;
  $("status").replaceChildren();
}

async function undoDelete(entry) {
  clearUndo();
  const scope = state.scope; // switching layers withdraws the offer, so it is this one's
  try {
    // Undo is a revert (section 10): back to the change just before the delete.
    const { changes } = await api("GET", keyPath(entry.key, "/history", scope));
    const deleted = changes.findIndex((change) => change.op === "delete");
    const before = deleted >= 0 ? changes[deleted + 1] : undefined;
    if (before && before.op === "set") {
      await api("POST", keyPath(entry.key, "/revert", scope), { to: before.id });
    } else {
      // The server keeps no history (memory.history.keep_days: 0): write the value back.
      await api("PUT", keyPath(entry.key, "", scope), { value: entry.value });
    }
    await reload();
    announce(`Restored “${entry.key}”.`);
  } catch (error) {
    showMessage($("page-error"), error.message);
  }
}

// --- history ---------------------------------------------------------------------------

async function openHistory(key) {
  state.historyKey = key;
  state.historyScope = state.scope;
  $("history-title").textContent = `History of “${key}”`;
  $("history-list").replaceChildren();
  showMessage($("history-error"), "");
  $("history-state").textContent = "Loading…";
  $("history-dialog").showModal();
  await renderHistory();
}

// Every change of the key: the route answers a page at a time (at most 500), newest first.
async function keyHistory(key, scope) {
  const changes = [];
  let next = null;
  do {
    const before = next === null ? "" : `&before=${next}`;
    const page = await api("GET", keyPath(key, `/history?limit=500${before}`, scope));
    changes.push(...page.changes);
    next = page.next;
  } while (next !== null);
  return changes;
}

async function renderHistory() {
  const key = state.historyKey;
  try {
    const changes = await keyHistory(key, state.historyScope);
    const items = changes.map((change, index) => changeItem(key, change, index === 0));
    $("history-list").replaceChildren(...items);
    $("history-state").textContent = changes.length
      ? "Newest first. Restore sets the memory back to the value it had after that change."
      : "No changes are recorded for this key.";
  } catch (error) {
    $("history-state").textContent = "";
    showMessage($("history-error"), error.message);
  }
}

function changeItem(key, change, current) {
  const what = change.op === "delete" ? "Deleted" : change.old_value === null ? "Created" : "Changed";
  const shown = change.op === "delete" ? change.old_value : change.new_value;
  const restore = element("button", {
    type: "button",
    class: "quiet",
    text: "Restore",
    onclick: () => restoreChange(key, change),
  });
  if (current) {
    restore.disabled = true;
    restore.title = "This is the current value";
  }
  return element(
    "li",
    { class: "change" },
    element(
      "p",
      { class: "meta" },
      element("strong", { text: what }),
      element("span", { class: `source source-${change.source}`, title: SOURCE_HINTS[change.source] || "", text: change.source }),
      timeElement(change.at),
      current ? element("span", { class: "badge", text: "current" }) : "",
    ),
    element("p", { class: change.op === "delete" ? "value removed" : "value", text: shown ?? "" }),
    element("div", { class: "actions" }, restore),
  );
}

async function restoreChange(key, change) {
  showMessage($("history-error"), "");
  try {
    await api("POST", keyPath(key, "/revert", state.historyScope), { to: change.id });
    await reload();
    announce(`Restored “${key}” to its value from ${format().exact.format(new Date(change.at))}.`);
    if (state.overview.memories.some((entry) => entry.key === key)) {
      await renderHistory();
    } else {
      $("history-dialog").close();
    }
  } catch (error) {
    showMessage($("history-error"), error.message);
  }
}

// --- suggestions: the memory agent's proposals, kept or dismissed -----------------------

async function reloadProposals() {
  const scope = state.scope;
  const { proposals } = await api("GET", inLayer("/memory/proposals", scope));
  if (scope === state.scope) renderProposals(proposals);
}

function renderProposals(proposals) {
  const items = proposals.map(proposalItem);
  $("proposals").replaceChildren(...items);
  $("suggestions-count").textContent = `(${proposals.length})`;
  $("suggestions").hidden = proposals.length === 0;
}

function proposalItem(proposal) {
  const keyId = `proposal-key-${proposal.id}`;
  const forget = proposal.op === "delete";
  const stored = state.overview && state.overview.memories.find((entry) => entry.key === proposal.key);
  const what = forget ? "forget" : stored ? "replace" : "remember";
  // A suggestion to forget shows what would be forgotten.
  const shown = forget ? (stored ? stored.value : "Forget this memory.") : proposal.value;
  return element(
    "li",
    { class: forget ? "entry proposal forget" : "entry proposal" },
    element(
      "div",
      { class: "entry-top" },
      element("h3", { class: "key", id: keyId, text: proposal.key }),
      element("p", { class: "meta" }, element("span", { text: what }), timeElement(proposal.created_at)),
    ),
    element("p", { class: forget && stored ? "value removed" : "value", text: shown }),
    element(
      "div",
      { class: "actions" },
      element("button", { type: "button", class: "primary", "aria-describedby": keyId, text: "Keep", onclick: () => keepProposal(proposal) }),
      element("button", { type: "button", class: "quiet", "aria-describedby": keyId, text: "Dismiss", onclick: () => dismissProposal(proposal) }),
    ),
  );
}

async function keepProposal(proposal) {
  showMessage($("suggestions-error"), "");
  try {
    await api("POST", inLayer(`/memory/proposals/${proposal.id}/accept`));
  } catch (error) {
    // A refused one (the token limit, a key no longer allowed) stays pending: say why.
    showMessage($("suggestions-error"), `“${proposal.key}”: ${error.message}`);
    return;
  }
  await Promise.all([reload(), reloadProposals()]).catch((error) => showMessage($("page-error"), error.message));
  announce(proposal.op === "delete" ? `Forgot “${proposal.key}”.` : `Kept “${proposal.key}”.`);
}

async function dismissProposal(proposal) {
  showMessage($("suggestions-error"), "");
  try {
    await api("POST", inLayer(`/memory/proposals/${proposal.id}/reject`));
    await reloadProposals();
    announce(`Dismissed the suggestion for “${proposal.key}”.`);
  } catch (error) {
    showMessage($("suggestions-error"), error.message);
  }
}

// --- preferences, export, import, clear ------------------------------------------------

async function toggleMemory() {
  const box = $("use-memory");
  const wanted = box.checked;
  showMessage($("page-error"), "");
  try {
    const { memories } = await api("PATCH", "/preferences", { memories: wanted });
    box.checked = memories;
    if (state.overview) {
      state.overview.enabled = memories;
      renderEmpty();
    }
    announce(memories ? "Memory is on for your chats." : "Memory is off: chats neither read nor save it.");
  } catch (error) {
    box.checked = !wanted;
    showMessage($("page-error"), error.message);
  }
}

async function toggleReview() {
  const box = $("review");
  const wanted = box.checked;
  showMessage($("page-error"), "");
  try {
    const { review } = await api("PATCH", "/preferences", { review: wanted });
    box.checked = review;
    announce(review ? "The assistant now asks before remembering." : "The assistant remembers without asking.");
  } catch (error) {
    box.checked = !wanted;
    showMessage($("page-error"), error.message);
  }
}

async function exportMemory() {
  showMessage($("page-error"), "");
  try {
    // A scope's export holds that scope; the person's own holds every layer, each entry
    // with its "scope", so that importing it puts each back where it was.
    const scope = state.scope;
    const document_ = await api("GET", inLayer("/memory/export", scope));
    const blob = new Blob([JSON.stringify(document_, null, 2)], { type: "application/json" });
    // A scope's name may hold ":", "/" and "@", which a file name may not.
    const named = scope === null ? "" : `-${scope.replace(/[^A-Za-z0-9._-]/g, "_")}`;
    const link = element("a", {
      href: URL.createObjectURL(blob),
      download: `kvmem-memory${named}-${new Date().toISOString().slice(0, 10)}.json`,
    });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 0);
    const count = plural(document_.memories.length, "memory", "memories");
    const scoped = scope === null && document_.memories.some((entry) => entry.scope != null);
    announce(scoped ? `Exported ${count}: your own and every scope's.` : `Exported ${count}.`);
  } catch (error) {
    showMessage($("page-error"), error.message);
  }
}

async function importMemory() {
  const input = $("import-file");
  const file = input.files[0];
  input.value = "";
  if (!file) return;
  showMessage($("page-error"), "");
  try {
    // Into the scope shown; on the person's own memory, each entry into the layer it names.
    const result = await api("POST", inLayer("/memory/import?mode=merge"), await file.text());
    const [names] = await Promise.all([loadScopes(), reload()]);
    renderScopes(names);
    announce(`Imported ${plural(result.imported, "memory", "memories")} from ${file.name}.`);
  } catch (error) {
    showMessage($("page-error"), `${file.name}: ${error.message}`);
  }
}

async function clearAll() {
  $("clear-dialog").close();
  showMessage($("page-error"), "");
  try {
    // One layer: the scope shown, or the person's own memory (their scopes stay).
    const { deleted } = await api("DELETE", inLayer("/memory"));
    clearUndo();
    endEdit();
    await Promise.all([reload(), reloadProposals()]);
    announce(`Cleared ${plural(deleted, "memory", "memories")}.`);
    $("entries-title").focus();
  } catch (error) {
    showMessage($("page-error"), error.message);
  }
}

// --- wiring ----------------------------------------------------------------------------

function wire() {
  $("sign-in-form").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", signOut);
  $("entry-form").addEventListener("submit", saveEntry);
  $("entry-form").addEventListener("keydown", (event) => {
    if (event.key === "Escape" && state.editing !== null) endEdit();
  });
  $("cancel-edit").addEventListener("click", () => {
    endEdit();
    $("entry-key").focus();
  });
  $("use-memory").addEventListener("change", toggleMemory);
  $("review").addEventListener("change", toggleReview);
  $("export").addEventListener("click", exportMemory);
  $("import").addEventListener("click", () => $("import-file").click());
  $("import-file").addEventListener("change", importMemory);
  $("clear-all").addEventListener("click", () => $("clear-dialog").showModal());
  $("clear-cancel").addEventListener("click", () => $("clear-dialog").close());
  $("clear-confirm").addEventListener("click", clearAll);
  $("history-close").addEventListener("click", () => $("history-dialog").close());
  $("layer-select").addEventListener("change", chooseLayer);
  $("new-scope").addEventListener("click", () => toggleNewScope($("new-scope-form").hidden));
  $("new-scope-form").addEventListener("submit", openScope);
  $("new-scope-cancel").addEventListener("click", () => {
    toggleNewScope(false);
    $("new-scope").focus();
  });
  $("new-scope-form").addEventListener("keydown", (event) => {
    if (event.key === "Escape") {
      toggleNewScope(false);
      $("new-scope").focus();
    }
  });
  setInterval(refreshTimes, 60_000);
  $("switch-cancel").addEventListener("click", () => $("switch-dialog").close("stay"));
  $("switch-confirm").addEventListener("click", () => $("switch-dialog").close("switch"));
  // A link with #token= followed from this very page changes only the fragment: no reload.
  window.addEventListener("hashchange", async () => {
    const link = tokenFromFragment();
    if (!link) return;
    const notice = await adoptLinkToken(link);
    const token = sessionStorage.getItem(TOKEN_STORAGE);
    if (token === state.token && !notice) return; // the person stayed who they were
    state.token = token;
    start(notice);
  });
}

async function openPage() {
  const notice = await adoptLinkToken(tokenFromFragment());
  state.token = sessionStorage.getItem(TOKEN_STORAGE);
  start(notice);
}

wire();
openPage();
