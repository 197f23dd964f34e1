// amqlite console: a small page on the JSON API (/api/v1), no framework, no build step.
// Every state change is a POST/DELETE with the X-Requested-By header (the API's CSRF
// defence); the browser's own Basic login covers the API calls of the page.
"use strict";

const API = "/api/v1";
const REFRESH_MS = 2000;  // live depths: one /destinations call every 2 s
let timer = null;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "onclick") node.onclick = v;
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

async function overview(main) {
  const [node, group, dests] = await Promise.all([
    api("GET", "/node"), api("GET", "/group"), api("GET", "/destinations")]);
  main.replaceChildren(
    el("h2", {}, `Group ${node.group}`),
    el("p", { class: "muted", id: "takeover" },
       `Epoch ${node.epoch ?? "-"}; last takeover ${node.master_since ? new Date(node.master_since * 1000).toLocaleString() : "-"} by ${node.name}`),
    table("group", ["node", "role", "epoch", "STOMP", "console", "last heartbeat"],
      group.nodes.map(n => el("tr", { "data-name": n.name },
        el("td", {}, n.name),
        el("td", {}, el("span", { class: `pill ${n.role}` }, n.role)),
        el("td", {}, String(n.epoch ?? "-")),
        el("td", {}, n.services.join(", ")),
        el("td", {}, n.http ? el("a", { href: n.http }, n.http) : "-"),
        el("td", {}, when(n.heartbeat_at))))),
    el("h2", {}, "Destinations"),
    destinationsTable(dests.destinations));
  timer = setInterval(async () => {
    try {
      const d = await api("GET", "/destinations");
      document.getElementById("destinations").replaceWith(destinationsTable(d.destinations));
    } catch (e) { flash(`refresh failed: ${e.message}`, true); }
  }, REFRESH_MS);
}

function destinationsTable(rows) {
  return table("destinations",
    ["destination", "kind", { label: "waiting", num: 1 }, { label: "in flight", num: 1 },
     { label: "consumers", num: 1 }, { label: "enqueued", num: 1 }, { label: "dequeued", num: 1 },
     { label: "dead-lettered", num: 1 }],
    rows.map(d => el("tr", { "data-name": d.name },
      el("td", {}, d.kind === "queue" ? el("a", { href: "#/" + destPath(d.name) }, d.name) : d.name),
      el("td", {}, d.kind), num(d.waiting), num(d.in_flight), num(d.consumers),
      num(d.enqueued), num(d.dequeued), num(d.dead_lettered))));
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
  main.replaceChildren(
    el("h2", {}, name),
    el("p", { id: "stats", class: "muted" },
       `${info.waiting} waiting, ${info.in_flight} in flight, ${info.consumers} consumers; ` +
       `${info.enqueued} enqueued, ${info.dequeued} dequeued, ${info.dead_lettered} dead-lettered`),
    toolbar,
    rows.length ? table("messages", ["", "id", "message-id", { label: "prio", num: 1 },
                                      { label: "deliveries", num: 1 }, "in flight",
                                      "original destination", "body"], rows)
                : el("p", { id: "empty" }, "No messages."),
    page.next_after ? el("p", { class: "muted" }, `Showing the first ${rows.length}.`) : "");
  async function render() { await destination(main, name); }
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

// -- routing ------------------------------------------------------------------------------

async function route() {
  clearInterval(timer);
  const main = document.getElementById("main");
  const hash = decodeURIComponent(location.hash.replace(/^#/, "")) || "/";
  for (const a of document.querySelectorAll("nav a"))
    a.classList.toggle("active", a.getAttribute("href") === "#" + hash);
  try {
    const node = await api("GET", "/node");
    document.getElementById("node").textContent =
      `${node.name}: ${node.role}${node.ready ? "" : " (not ready)"}`;
    if (hash === "/") await overview(main);
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
