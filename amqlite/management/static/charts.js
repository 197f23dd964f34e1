// amqlite console charts: line charts drawn as plain SVG from /api/v1/rates, no library,
// no network. A chart ends at the newest sample and spans what there is, at least a
// minute (RabbitMQ's default range) and at most the sampler's window (10 minutes), so it
// scrolls as samples come; a null value (no sample) breaks the line.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const CHART_W = 560, CHART_H = 150, PAD_L = 56, PAD_R = 8, PAD_T = 8, PAD_B = 20;
const MIN_SPAN_MS = 60 * 1000;
const COLOURS = ["#2563a8", "#1e7d32", "#c2410c", "#7c3aed", "#b3261e", "#0e7490"];

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

// A round upper bound for the y axis: 1, 2 or 5 times a power of ten (bytes: a power of 2).
function niceMax(v, unit) {
  if (!(v > 0)) return 1;
  if (unit === "bytes") return Math.pow(2, Math.ceil(Math.log2(v)));
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

function formatValue(v, unit) {
  if (v === null || v === undefined) return "-";
  if (unit === "bytes") {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return `${v >= 100 || i === 0 ? Math.round(v) : v.toFixed(1)} ${units[i]}`;
  }
  const shown = Math.abs(v) >= 100 || Number.isInteger(v) ? Math.round(v) : v.toFixed(1);
  return unit ? `${shown} ${unit}` : String(shown);
}

function pathOf(times, values, x, y) {
  let d = "", pen = false;
  for (let i = 0; i < times.length; i++) {
    const v = values[i];
    if (v === null || v === undefined) { pen = false; continue; }
    d += `${pen ? "L" : "M"}${x(times[i]).toFixed(1)},${y(v).toFixed(1)}`;
    pen = true;
  }
  return d;
}

// lineChart("chart-id", "title", rates.times, [{name, label, values}], {unit, window, limit})
// -> a <figure> holding the SVG; each line is <path data-series=NAME data-last=VALUE>.
function lineChart(id, title, times, series, opts = {}) {
  const end = times.length ? times[times.length - 1] : Date.now();
  const windowMs = Math.min((opts.window ?? 600) * 1000,
                            Math.max(MIN_SPAN_MS, times.length ? end - times[0] : 0));
  const start = end - windowMs;
  let top = opts.limit ?? 0;
  for (const s of series) for (const v of s.values) if (v !== null && v > top) top = v;
  top = niceMax(top, opts.unit);
  const plotW = CHART_W - PAD_L - PAD_R, plotH = CHART_H - PAD_T - PAD_B;
  const x = t => PAD_L + Math.max(0, (t - start) / windowMs) * plotW;
  const y = v => PAD_T + plotH - (v / top) * plotH;
  const chart = svg("svg", { viewBox: `0 0 ${CHART_W} ${CHART_H}`, class: "chart",
                             role: "img", "aria-label": title });
  for (const frac of [0, 0.5, 1]) {
    const gy = y(top * frac);
    chart.append(svg("line", { x1: PAD_L, x2: CHART_W - PAD_R, y1: gy, y2: gy, class: "grid" }),
                 svg("text", { x: PAD_L - 4, y: gy + 4, class: "axis", "text-anchor": "end" },
                     formatValue(top * frac, opts.unit)));
  }
  chart.append(svg("text", { x: PAD_L, y: CHART_H - 4, class: "axis" },
                   windowMs >= 120000 ? `-${Math.round(windowMs / 60000)} min`
                                      : `-${Math.round(windowMs / 1000)} s`),
               svg("text", { x: CHART_W - PAD_R, y: CHART_H - 4, class: "axis",
                             "text-anchor": "end" }, "now"));
  if (opts.limit) {
    const ly = y(opts.limit);
    chart.append(svg("line", { x1: PAD_L, x2: CHART_W - PAD_R, y1: ly, y2: ly, class: "limit" }));
  }
  const legend = document.createElement("figcaption");
  legend.append(Object.assign(document.createElement("strong"), { textContent: title }));
  series.forEach((s, i) => {
    const colour = COLOURS[i % COLOURS.length];
    const last = [...s.values].reverse().find(v => v !== null && v !== undefined) ?? null;
    // Earlier series are drawn wider, so equal values (every message acknowledged as
    // soon as delivered) still show each colour.
    chart.append(svg("path", { d: pathOf(times, s.values, x, y), stroke: colour,
                               "stroke-width": 1.5 + 2 * (series.length - 1 - i),
                               class: "line", "data-series": s.name,
                               "data-last": last === null ? "" : last }));
    const at = times.length - 1;
    if (at >= 0 && s.values[at] !== null && s.values[at] !== undefined)
      chart.append(svg("circle", { cx: x(times[at]), cy: y(s.values[at]), r: 2.5, fill: colour }));
    const item = document.createElement("span");
    item.className = "legend";
    item.dataset.series = s.name;
    item.style.borderColor = colour;
    item.textContent = `${s.label ?? s.name} ${formatValue(last, opts.unit)}`;
    legend.append(item);
  });
  if (opts.limit) {
    const item = document.createElement("span");
    item.className = "legend limit";
    item.textContent = `limit ${formatValue(opts.limit, opts.unit)}`;
    legend.append(item);
  }
  const figure = document.createElement("figure");
  figure.id = id;
  figure.className = "chart";
  figure.append(legend, chart);
  return figure;
}
