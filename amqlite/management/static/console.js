// amqlite console: a small page on the JSON API (/api/v1), no framework, no build step.
// Every state change is a POST/DELETE with the X-Requested-By header (the API's CSRF
// defence); the browser's own Basic login covers the API calls of the page.
"use strict";

const API = "/api/v1";
const REFRESH_MS = 2000;  // live figures: the sampler takes one sample every 2 s
let timer = null;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "onclick") node.onclick = v;
    else if (k === "onsubmit") node.onsubmit = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return node;
}

async function api(method, path, body) {
  const opts = { method, headers: { "Accept": "application/json" }, credentials: "same-origin" };
  if (method !== "GET") {
    opts.headers["X-Requested-By"] = "amqlite-console";
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body ?? {});
  }
  const resp = await fetch(API + path, opts);
  const data = await resp.json().catch(() => ({ error: resp.statusText }));
  if (!resp.ok) throw new Error(data.error || resp.statusText);
  return data;
}

function flash(text, error = false) {
  const f = document.getElementById("flash");
  f.textContent = text;
  f.className = error ? "error" : "";
  f.hidden = false;
}

function destPath(name) { return name.replace(/^\//, ""); }  // "/queue/a" -> "queue/a"

function table(id, headers, rows) {
  const head = el("tr", {}, ...headers.map(h => el("th", { class: h.num ? "num" : "" }, h.label ?? h)));
  return el("table", { id }, el("thead", {}, head), el("tbody", {}, ...rows));
}

function num(v) { return el("td", { class: "num" }, String(v)); }

function when(ms) { return ms ? new Date(ms).toLocaleString() : "-"; }

// Run fn every REFRESH_MS until the page changes (route() clears the timer); one call at
// a time, so a slow broker is never asked twice at once.
let refreshFailed = false;
// The group as last read: when this node stops answering (it died, or was demoted), the
// failure names the other nodes' consoles, so an operator can follow the takeover.
let lastGroup = null;
function every(fn, now = false) {
  const tick = async () => {
    try {
      await fn();
      if (refreshFailed) {
        document.getElementById("flash").hidden = true;
        document.getElementById("main").classList.remove("unanswered");
        refreshFailed = false;
      }
    } catch (e) { refreshError(e); }
    if (timer === handle) timer = handle = setTimeout(tick, REFRESH_MS);
  };
  let handle = timer = setTimeout(tick, now ? 0 : REFRESH_MS);
}

function refreshError(e) {
  refreshFailed = true;
  document.getElementById("main").classList.add("unanswered");  // what it shows is old
  flash(`refresh failed: ${e.message}`, true);
  const me = document.getElementById("node").dataset.name;
  const others = (lastGroup?.nodes ?? []).filter(n => n.name !== me && n.http);
  if (others.length)
    document.getElementById("flash").append("; the group's other consoles: ",
      ...others.flatMap((n, i) => [i ? ", " : "", el("a", { href: n.http, class: "other-console" },
                                                         `${n.name} (${n.role})`)]));
}

function showNode(node) {
  document.getElementById("node").dataset.name = node.name;
  document.getElementById("node").textContent =
    `${node.name}: ${node.role}${node.ready ? "" : " (not ready)"}`;
}

async function act(what, method, path, body, then) {
  try {
    const result = await api(method, path, body);
    flash(`${what}: ${JSON.stringify(result)}`);
    if (then) await then(result);
  } catch (e) {
    flash(`${what} failed: ${e.message}`, true);
  }
}

// -- pages -----------------------------------------------------------------------------

// The overview refreshes itself in place every REFRESH_MS: the group (a takeover shows
// within a refresh), the node's health and charts, the destinations. On a slave only the
// group and the node answer; the page waits there until this node (or the master named
// in the group) serves.
async function overview(main) {
  const node = await api("GET", "/node");
  main.replaceChildren(
    el("h2", {}, `Group ${node.group}`),
    el("p", { class: "muted", id: "takeover" }, ""),
    el("div", { id: "group" }),
    el("div", { id: "serving" }));
  let serving = null;
  const refresh = async () => {
    const [me, group] = await Promise.all([api("GET", "/node"), api("GET", "/group")]);
    lastGroup = group;
    showNode(me);
    document.getElementById("takeover").textContent =
      `Master ${group.master ?? "none"}; this node (${me.name}) is ${me.role}, epoch ` +
      `${me.epoch ?? "-"}, last takeover ${me.master_since ? new Date(me.master_since * 1000).toLocaleString() : "-"}`;
    document.getElementById("group").replaceWith(groupTable(group));
    if (me.ready !== serving) {
      serving = me.ready;
      document.getElementById("serving").replaceWith(serving ? servingPanel()
        : el("div", { id: "serving" }, el("p", { id: "not-master", class: "muted" },
            `This node is ${me.role}: rates, destinations and actions are on the master` +
            (me.master && me.master.http ? "" : " (none registered yet)") + ". ",
            me.master && me.master.http ? el("a", { href: me.master.http }, `Open ${me.master.name}'s console`) : "")));
    }
    if (serving) await refreshServing();
  };
  every(refresh, true);
}

function groupTable(group) {
  return table("group", ["node", "role", "epoch", "heartbeat", "STOMP", "console"],
    group.nodes.map(n => el("tr", { "data-name": n.name, class: n.stale ? "stale" : "" },
      el("td", {}, n.name),
      el("td", {}, el("span", { class: `pill ${n.stale ? "stale" : n.role}` },
                      n.stale ? `${n.role} (stale)` : n.role)),
      el("td", {}, String(n.epoch ?? "-")),
      el("td", { class: "num" }, n.heartbeat_age_ms === null ? "-" : `${(n.heartbeat_age_ms / 1000).toFixed(1)} s ago`),
      el("td", {}, n.services.join(", ")),
      el("td", {}, n.http ? el("a", { href: n.http }, n.http) : "-"))));
}

function servingPanel() {
  return el("div", { id: "serving" },
    el("h2", {}, "Node"), el("div", { id: "health", class: "tiles" }),
    el("div", { id: "node-charts", class: "charts" }),
    el("h2", {}, "Destinations"), el("div", { id: "destinations" }));
}

function tile(id, label, value, detail = "") {
  return el("div", { class: "tile", id }, el("span", { class: "muted" }, label),
            el("strong", {}, value), el("span", { class: "muted" }, detail));
}

function lastOf(values) { return [...values].reverse().find(v => v !== null) ?? null; }

async function refreshServing() {
  const [rates, dests] = await Promise.all([api("GET", "/rates"), api("GET", "/destinations")]);
  const n = rates.node, t = rates.times, w = rates.window;
  const used = lastOf(n.memory_used), paused = lastOf(n.paused_producers);
  const share = rates.memory_limit ? Math.round(100 * (used ?? 0) / rates.memory_limit) : 0;
  document.getElementById("health").replaceChildren(
    tile("tile-memory", "memory", `${formatValue(used, "bytes")} / ${formatValue(rates.memory_limit, "bytes")}`,
         `${share}% of the budget; ${formatValue(lastOf(n.memory_held), "bytes")} held`),
    tile("tile-paused", "paused producers", String(paused ?? "-"), "flow control"),
    tile("tile-connections", "connections", String(lastOf(n.connections) ?? "-")),
    tile("tile-commit", "store commit", formatValue(lastOf(n.commit_ms), "ms"),
         `max ${formatValue(lastOf(n.commit_max_ms), "ms")} in the last ${rates.interval} s`),
    tile("tile-rates", "messages/s", `${formatValue(lastOf(n.enqueued))} in`,
         `${formatValue(lastOf(n.delivered))} delivered, ${formatValue(lastOf(n.acknowledged))} acked`));
  document.getElementById("node-charts").replaceChildren(
    lineChart("chart-node-rates", "Messages per second", t, [
      { name: "enqueued", values: n.enqueued }, { name: "delivered", values: n.delivered },
      { name: "acknowledged", values: n.acknowledged }], { window: w }),
    lineChart("chart-node-depth", "Messages waiting and in flight", t, [
      { name: "waiting", values: n.waiting }, { name: "in_flight", label: "in flight", values: n.in_flight }],
      { window: w }),
    lineChart("chart-node-memory", "Memory", t, [
      { name: "memory_used", label: "used", values: n.memory_used },
      { name: "memory_held", label: "of which held", values: n.memory_held }],
      { window: w, unit: "bytes", limit: rates.memory_limit }),
    lineChart("chart-node-commit", "Store commit (ms)", t, [
      { name: "commit_ms", label: "mean", values: n.commit_ms },
      { name: "commit_max_ms", label: "max", values: n.commit_max_ms }], { window: w }),
    lineChart("chart-node-clients", "Connections, consumers, paused producers", t, [
      { name: "connections", values: n.connections }, { name: "consumers", values: n.consumers },
      { name: "paused_producers", label: "paused", values: n.paused_producers }], { window: w }));
  document.getElementById("destinations").replaceWith(destinationsTable(dests.destinations, rates.destinations));
}

function destinationsTable(rows, latest = {}) {
  const rate = v => num(v === null || v === undefined ? "-" : formatValue(v));
  return table("destinations",
    ["destination", "kind", { label: "waiting", num: 1 }, { label: "in flight", num: 1 },
     { label: "consumers", num: 1 }, { label: "enqueued", num: 1 }, { label: "dequeued", num: 1 },
     { label: "expired", num: 1 }, { label: "dead-lettered", num: 1 }, { label: "moved", num: 1 },
     { label: "purged", num: 1 }, { label: "dropped", num: 1 }, { label: "in/s", num: 1 }, { label: "out/s", num: 1 },
     { label: "ack/s", num: 1 }],
    rows.map(d => el("tr", { "data-name": d.name },
      el("td", {}, el("a", { href: "#/" + destPath(d.name) }, d.name)),
      el("td", {}, d.kind), num(d.waiting), num(d.in_flight), num(d.consumers),
      num(d.enqueued), num(d.dequeued), num(d.expired), num(d.dead_lettered), num(d.moved),
      num(d.purged), num(d.overflow_dropped), rate(latest[d.name]?.enqueued), rate(latest[d.name]?.delivered),
      rate(latest[d.name]?.acknowledged))));
}

async function destination(main, name) {
  const info = await api("GET", "/destinations/" + destPath(name));
  const page = await api("GET", `/messages/${destPath(name)}?limit=50`);
  const reload = () => render();
  const selected = () => [...main.querySelectorAll("input.pick:checked")].map(c => Number(c.value));
  const target = el("input", { type: "text", id: "move-to", placeholder: "/queue/target" });
  const dead = page.messages.some(m => m.headers["original-destination"]);
  const toolbar = el("div", { class: "toolbar" },
    el("button", { id: "purge", class: "danger", onclick: () => {
      if (confirm(`Purge every waiting message of ${name}?`))
        act(`purge ${name}`, "POST", "/purge/" + destPath(name), {}, reload);
    } }, "Purge"),
    el("button", { id: "delete-destination", class: "danger", onclick: () => {
      if (confirm(`Delete ${name} and every message in it, for good?`))
        act(`delete ${name}`, "DELETE", "/destinations/" + destPath(name), undefined,
            () => { location.hash = "#/"; });
    } }, `Delete ${info.kind}`),
    el("button", { id: "delete-selected", class: "danger", onclick: async () => {
      for (const id of selected()) await act(`delete message ${id}`, "DELETE", `/message/${id}`);
      reload();
    } }, "Delete selected"),
    target,
    el("button", { id: "move-selected", onclick: () => {
      const ids = selected();
      act(`move to ${target.value}`, "POST", "/move/" + destPath(name),
          ids.length ? { to: target.value, ids } : { to: target.value }, reload);
    } }, "Move selected (none: all)"),
    ...(dead ? [
      el("button", { id: "retry-selected", onclick: () =>
        act("retry", "POST", "/retry/" + destPath(name), { ids: selected() }, reload) }, "Retry selected"),
      el("button", { id: "retry-all", onclick: () =>
        act("retry all", "POST", "/retry/" + destPath(name), {}, reload) }, "Retry all"),
    ] : []));
  const rows = page.messages.map(m => el("tr", { "data-id": String(m.id) },
    el("td", {}, el("input", { type: "checkbox", class: "pick", value: String(m.id) })),
    el("td", {}, el("a", { href: `#/message/${m.id}` }, String(m.id))),
    el("td", {}, m.message_id), num(m.priority), num(m.delivery_count),
    el("td", {}, m.in_flight ? "yes" : ""),
    el("td", {}, m.headers["original-destination"] ?? ""),
    el("td", { class: "body" }, m.body ?? "<binary>")));
  const stats = d => `${d.waiting} waiting, ${d.in_flight} in flight, ${d.consumers} consumers; ` +
    `${d.enqueued} enqueued, ${d.delivered} delivered, ${d.dequeued} dequeued, ${d.expired} expired, ` +
    `${d.dead_lettered} dead-lettered, ${d.moved} moved, ${d.purged} purged`;
  main.replaceChildren(
    el("h2", {}, name),
    el("p", { id: "stats", class: "muted" }, stats(info)),
    el("div", { id: "dest-charts", class: "charts" }),
    el("p", { id: "policy", class: "muted" }, "Policy: " + (info.policy && info.policy.pattern
      ? `${info.policy.pattern}: ${info.policy.summary}` : `defaults: ${info.policy ? info.policy.summary : ""}`)),
    toolbar,
    rows.length ? table("messages", ["", "id", "message-id", { label: "prio", num: 1 },
                                      { label: "deliveries", num: 1 }, "in flight",
                                      "original destination", "body"], rows)
                : el("p", { id: "empty" }, "No messages."),
    page.next_after ? el("p", { class: "muted" }, `Showing the first ${rows.length}.`) : "",
    el("h2", {}, "Send a message"), sendForm(name));
  const charts = async () => {
    document.getElementById("stats").textContent =
      stats(await api("GET", "/destinations/" + destPath(name)));
    let r;
    try { r = await api("GET", "/rates/" + destPath(name)); }
    catch (e) {  // not sampled yet: the next refresh will have it
      document.getElementById("dest-charts").replaceChildren(el("p", { class: "muted" }, e.message));
      return;
    }
    const s = r.series;
    document.getElementById("dest-charts").replaceChildren(
      lineChart("chart-dest-rates", "Messages per second", r.times, [
        { name: "enqueued", values: s.enqueued }, { name: "delivered", values: s.delivered },
        { name: "acknowledged", values: s.acknowledged }], { window: r.window }),
      lineChart("chart-dest-depth", "Waiting, in flight, consumers", r.times, [
        { name: "waiting", values: s.waiting },
        { name: "in_flight", label: "in flight", values: s.in_flight },
        { name: "consumers", values: s.consumers }], { window: r.window }));
  };
  every(charts, true);
  async function render() { clearTimeout(timer); timer = null; await destination(main, name); }
}

async function message(main, id) {
  const m = await api("GET", `/message/${id}`);
  main.replaceChildren(
    el("h2", {}, `Message ${m.id} in `, el("a", { href: "#/" + destPath(m.destination) }, m.destination)),
    el("pre", { id: "headers" }, JSON.stringify(m.headers, null, 2)),
    el("pre", { id: "body" }, m.body ?? `(binary, base64) ${m.body_base64}`));
}

async function connections(main) {
  const data = await api("GET", "/connections");
  main.replaceChildren(el("h2", {}, "Connections"),
    table("connections", ["address", "login", "client-id", "STOMP", "subscriptions",
                          { label: "unacked", num: 1 }, "since", ""],
      data.connections.map(c => el("tr", { "data-address": c.address },
        el("td", {}, c.address), el("td", {}, c.login ?? "-"), el("td", {}, c.client_id ?? "-"),
        el("td", {}, c.version), el("td", {}, c.subscriptions.map(s => s.destination).join(", ")),
        num(c.unacked), el("td", {}, c.connected_since ? new Date(c.connected_since * 1000).toLocaleString() : "-"),
        el("td", {}, el("button", { class: "danger close", onclick: () => {
          if (confirm(`Close the connection from ${c.address}?`))
            act(`close ${c.address}`, "DELETE", `/connections/${encodeURIComponent(c.address)}`,
                undefined, () => connections(main));
        } }, "Close"))))));
}

async function subscriptions(main) {
  const data = await api("GET", "/subscriptions");
  main.replaceChildren(el("h2", {}, "Durable subscriptions"),
    table("subscriptions", ["client-id", "name", "topic", "owner", { label: "pending", num: 1 },
                            "online", ""],
      data.subscriptions.map(s => el("tr", {},
        el("td", {}, s.client_id), el("td", {}, s.name), el("td", {}, s.topic),
        el("td", {}, s.owner ?? ""), num(s.pending),
        el("td", {}, s.online ? "yes" : "no"),
        el("td", {}, el("button", { class: "danger", onclick: () => {
          if (confirm(`Remove ${s.client_id}/${s.name}?`))
            act("remove subscription", "DELETE",
                `/subscriptions/${encodeURIComponent(s.client_id)}/${encodeURIComponent(s.name)}`,
                undefined, () => subscriptions(main));
        } }, "Remove"))))));
}

async function scheduled(main) {
  const data = await api("GET", "/scheduled?limit=500");
  const plan = p => !p ? "-" : [p.delay ? `delay ${p.delay} ms` : "", p.period ? `every ${p.period} ms` : "",
    p.repeat ? `${p.repeat} repeats` : "", p.cron ? `cron ${p.cron}` : ""].filter(x => x).join(", ");
  main.replaceChildren(el("h2", {}, "Scheduled messages"),
    el("p", { class: "muted", id: "scheduled-total" },
       `${data.total} scheduled` + (data.total > data.scheduled.length ? `; the first ${data.scheduled.length} by due time` : "")),
    data.scheduled.length ? table("scheduled", ["id", "destination", "due", "schedule",
                                                { label: "delivered", num: 1 }, "body", ""],
      data.scheduled.map(m => el("tr", { "data-id": String(m.id) },
        el("td", {}, String(m.id)), el("td", {}, m.destination ?? "-"),
        el("td", {}, when(m.deliver_at)), el("td", {}, plan(m.schedule)),
        num(m.schedule ? m.schedule.fired : 0),
        el("td", { class: "body" }, m.body ?? "<binary>"),
        el("td", {}, el("button", { class: "danger cancel", onclick: () => {
          if (confirm(`Cancel scheduled message ${m.id}?`))
            act(`cancel ${m.id}`, "DELETE", `/scheduled/${m.id}`, undefined, () => scheduled(main));
        } }, "Cancel")))))
      : el("p", { id: "empty" }, "No scheduled messages."));
}

// The send form: the message goes through the broker's own SEND path (persistent unless
// unticked, stored and fenced before the answer), as POST /send/{kind}/{name}.
function sendForm(fixed) {
  const dest = el("input", { type: "text", id: "send-destination", placeholder: "/queue/name",
                             value: fixed ?? "" });
  const body = el("textarea", { id: "send-body", rows: "4", placeholder: "message body" });
  const headers = el("textarea", { id: "send-headers", rows: "3",
    placeholder: "name: value, one a line (e.g. AMQ_SCHEDULED_DELAY: 60000)" });
  const persistent = el("input", { type: "checkbox", id: "send-persistent", checked: "" });
  const send = () => {
    const to = dest.value.trim();
    if (!/^\/(queue|topic)\/./.test(to)) return flash("send: the destination is /queue/NAME or /topic/NAME", true);
    const fields = {};
    for (const line of headers.value.split("\n").filter(l => l.trim())) {
      const at = line.indexOf(":");
      if (at < 1) return flash(`send: header line ${JSON.stringify(line)} is not name: value`, true);
      fields[line.slice(0, at).trim()] = line.slice(at + 1).trim();
    }
    act(`send to ${to}`, "POST", "/send/" + destPath(to),
        { body: body.value, headers: fields, persistent: persistent.checked });
  };
  return el("form", { id: "send-form", class: "send", onsubmit: e => { e.preventDefault(); send(); } },
    el("label", {}, "Destination ", dest),
    el("label", {}, "Body", body),
    el("label", {}, "Headers", headers),
    el("label", { class: "check" }, persistent, "persistent (stored before the answer)"),
    el("button", { type: "submit", id: "send" }, "Send"));
}

async function sendPage(main) {
  main.replaceChildren(el("h2", {}, "Send a message"), sendForm(null));
}

// -- routing ------------------------------------------------------------------------------

async function route() {
  clearTimeout(timer);
  timer = null;
  const main = document.getElementById("main");
  const hash = decodeURIComponent(location.hash.replace(/^#/, "")) || "/";
  for (const a of document.querySelectorAll("nav a"))
    a.classList.toggle("active", a.getAttribute("href") === "#" + hash);
  try {
    showNode(await api("GET", "/node"));
    if (hash === "/") await overview(main);
    else if (hash === "/send") await sendPage(main);
    else if (hash === "/connections") await connections(main);
    else if (hash === "/subscriptions") await subscriptions(main);
    else if (hash === "/scheduled") await scheduled(main);
    else if (hash.startsWith("/message/")) await message(main, hash.slice(9));
    else if (/^\/(queue|topic)\/./.test(hash)) await destination(main, hash);
    else main.replaceChildren(el("p", {}, "Unknown page."));
  } catch (e) {
    main.replaceChildren(el("p", { id: "error", class: "muted" }, e.message));
  }
}

window.addEventListener("hashchange", route);
route();
