/* dapbench site: sortable and filterable tables, and the group page's charts (drawn by Plotly, shipped beside
   this file). Everything a chart draws comes from the page's own JSON (#chart-data): nothing is fetched. */
"use strict";

function sortableTable(table) {
  const headers = Array.from(table.tHead.rows[0].cells);
  headers.forEach((th, index) => {
    th.classList.add("sortable");
    th.addEventListener("click", () => {
      const ascending = th.dataset.order !== "asc";
      headers.forEach((h) => delete h.dataset.order);
      th.dataset.order = ascending ? "asc" : "desc";
      sortRows(table, index, th.dataset.type === "number", ascending);
    });
  });
}

function sortRows(table, index, numeric, ascending) {
  const body = table.tBodies[0];
  const key = (row) => row.cells[index].dataset.value ?? row.cells[index].textContent;
  const rows = Array.from(body.rows);
  rows.sort((a, b) => {
    let x = key(a), y = key(b);
    if (numeric) {
      // an empty cell (n/a) sorts last whichever the direction
      if (x === "" || y === "") return (x === "") - (y === "");
      x = Number(x); y = Number(y);
      return ascending ? x - y : y - x;
    }
    return ascending ? x.localeCompare(y) : y.localeCompare(x);
  });
  rows.forEach((row) => body.appendChild(row));
}

function filterTable(table) {
  const text = document.getElementById("filter-text");
  const boxes = {option: "filter-options", replay: "filter-replay", domainId: "filter-domain-id", untrained: "filter-untrained"};
  const apply = () => {
    let shown = 0;
    for (const row of table.tBodies[0].rows) {
      let visible = row.dataset.method.toLowerCase().includes(text.value.trim().toLowerCase());
      for (const [flag, id] of Object.entries(boxes)) {
        if (row.dataset[flag] === "true" && !document.getElementById(id).checked) visible = false;
      }
      row.hidden = !visible;
      shown += visible;
    }
    document.getElementById("filter-count").textContent = `${shown} of ${table.tBodies[0].rows.length} rows`;
  };
  text.addEventListener("input", apply);
  Object.values(boxes).forEach((id) => document.getElementById(id).addEventListener("change", apply));
  apply();
}

/* ---- charts ---- */

const data = () => JSON.parse(document.getElementById("chart-data").textContent);
// Plotly renders its text as a subset of HTML (styles, links): every label from a record is drawn as text instead
const esc = (value) => String(value).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
const escAll = (values) => values.map(esc);
const isReference = (d, method) => Object.values(d.references).includes(method);
const picked = () => Array.from(document.querySelectorAll("input.pick:checked")).map((box) => box.value);
const layoutBase = {margin: {t: 30, r: 20, b: 50, l: 60}, hovermode: "closest", font: {size: 12},
                    legend: {orientation: "h", y: -0.2}};
const config = {displaylogo: false, responsive: true};

function drawStabilityPlasticity(d, methods) {
  const traces = d.points.filter((p) => methods.includes(p.method)).map((p) => {
    const reference = isReference(d, p.method);
    return {
      x: [p.x], y: [p.y], name: esc(p.method), mode: "markers+text", type: "scatter",
      text: [reference ? `★ ${esc(p.method)}` : esc(p.method)], textposition: "top center",
      textfont: {size: reference ? 13 : 10, color: reference ? "#000" : "#444"},
      error_x: {type: "data", array: [p.x_se ?? 0], visible: p.x_se !== null, color: d.colours[p.method]},
      error_y: {type: "data", array: [p.y_se ?? 0], visible: p.y_se !== null, color: d.colours[p.method]},
      marker: {color: d.colours[p.method], size: reference ? 15 : 10,
               line: {color: "#000", width: reference ? 2 : 0}, symbol: reference ? "star" : "circle"},
      hovertemplate: `${esc(p.method)}<br>plasticity %{x:.3f}<br>forgetting %{y:.3f}<extra></extra>`,
    };
  });
  Plotly.react("chart-sp", traces, {...layoutBase, showlegend: false,
    xaxis: {title: {text: "plasticity (nats, higher is better)"}, zeroline: true},
    yaxis: {title: {text: "forgetting (nats, lower is better)"}, zeroline: true}}, config);
}

function drawCurves(d, methods) {
  // small multiples: one panel per held-out set, one line per picked method
  const columns = d.loss_columns, perRow = 4, rows = Math.ceil(columns.length / perRow);
  const traces = [], layout = {...layoutBase, showlegend: true, height: 260 * rows + 80,
                                grid: {rows, columns: perRow, pattern: "independent"}, annotations: []};
  columns.forEach((column, j) => {
    const axis = j === 0 ? "" : String(j + 1);
    layout[`xaxis${axis}`] = {tickangle: -45, automargin: true};
    layout[`yaxis${axis}`] = {automargin: true};
    layout.annotations.push({text: esc(column), showarrow: false, xref: `x${axis} domain`, yref: `y${axis} domain`,
                             x: 0.5, y: 1.12, font: {size: 12}});
    methods.forEach((method) => {
      const matrix = d.losses[method];
      if (!matrix) return;
      const reference = isReference(d, method);
      traces.push({x: escAll(d.stages), y: matrix.map((row) => row[j]), xaxis: `x${axis}`, yaxis: `y${axis}`,
                   type: "scatter", mode: "lines+markers", name: esc(method), legendgroup: method, showlegend: j === 0,
                   line: {color: d.colours[method], width: reference ? 4 : 1.5},
                   marker: {size: reference ? 7 : 4}, hovertemplate: `${esc(method)}<br>%{x}: %{y:.3f}<extra>${esc(column)}</extra>`});
    });
  });
  Plotly.react("chart-curves", traces, layout, config);
}

function drawContinual(d, methods) {
  // two panels (earlier domains, general text) over updates since the first domain; rows without curves are absent
  if (!d.continual) return;
  const parts = Object.keys(d.continual.panels), traces = [];
  const layout = {...layoutBase, showlegend: true, height: 380, annotations: [],
                  grid: {rows: 1, columns: parts.length, pattern: "independent"}};
  parts.forEach((part, j) => {
    const axis = j === 0 ? "" : String(j + 1);
    layout[`xaxis${axis}`] = {title: {text: "updates since the first domain"}};
    layout[`yaxis${axis}`] = {automargin: true};
    layout.annotations.push({text: esc(d.continual.panels[part]), showarrow: false, xref: `x${axis} domain`,
                             yref: `y${axis} domain`, x: 0.5, y: 1.1, font: {size: 12}});
    for (const [method, row] of Object.entries(d.continual.rows)) {
      if (!methods.includes(method)) continue;
      traces.push({x: row.x, y: row[part], xaxis: `x${axis}`, yaxis: `y${axis}`, type: "scatter", mode: "lines",
                   name: esc(method), legendgroup: method, showlegend: j === 0, connectgaps: false,
                   line: {color: d.colours[method], width: isReference(d, method) ? 3 : 1.5},
                   hovertemplate: `${esc(method)} (${row.seeds} seeds)<br>update %{x}: %{y:.3f}<extra></extra>`});
    }
  });
  Plotly.react("chart-continual", traces, layout, config);
}

function drawMatrices(d) {
  const method = document.getElementById("matrix-method").value;
  const heat = (matrix, x, y, title, id, digits, scale) => Plotly.react(id, [{
    z: matrix, x, y, type: "heatmap", colorscale: scale, texttemplate: `%{z:.${digits}f}`, hoverongaps: false,
    hovertemplate: "%{y} · %{x}: %{z}<extra></extra>"}],
    {...layoutBase, title: {text: title}, yaxis: {autorange: "reversed", automargin: true},
     xaxis: {automargin: true, tickangle: -30}}, config);
  heat(d.losses[method], escAll(d.loss_columns), escAll(d.stages), `${esc(method)}: held-out loss L[t][k] (${d.unit})`,
       "chart-loss-matrix", 3, "Viridis");
  heat(d.scores[method], escAll(d.tasks), escAll(d.stages.slice(1)), `${esc(method)}: end-task macro-F1 A[t][k] (%)`,
       "chart-score-matrix", 1, "Cividis");
}

function drawLadders(d, methods) {
  d.ladders.forEach((ladder, i) => {
    // five panels a row, each x axis ticked at the rungs' budgets only (log-scale minor labels overlap)
    const titles = ladder.titles, traces = [], columns = Math.min(5, titles.length);
    const rows = Math.ceil(titles.length / columns);
    let shownUntrained = false;
    const ticks = {tickvals: ladder.tokens, ticktext: ladder.tokens.map((t) => `${Math.round(t / 1000)}K`)};
    const layout = {...layoutBase, grid: {rows, columns, pattern: "independent", ygap: 0.3, xgap: 0.3},
                    annotations: [], height: 290 * rows + 110, legend: {orientation: "h", y: -0.12}};
    titles.forEach((title, j) => {
      const axis = j === 0 ? "" : String(j + 1);
      layout[`xaxis${axis}`] = {type: "log", ...ticks};
      layout.annotations.push({text: esc(title), showarrow: false, xref: `x${axis} domain`, yref: `y${axis} domain`,
                               x: 0.5, y: 1.12});
      for (const [method, values] of Object.entries(ladder.metrics[title])) {
        if (!methods.includes(method)) continue;
        const reach = ladder.errors[title][method];  // the row's 95% bootstrap interval at each rung
        traces.push({x: ladder.tokens, y: values, xaxis: `x${axis}`, yaxis: `y${axis}`, name: esc(method),
                     legendgroup: method, showlegend: j === 0, type: "scatter", mode: "lines+markers",
                     line: {color: d.colours[method], width: isReference(d, method) ? 4 : 1.5},
                     hovertemplate: `${esc(method)}<br>%{x:,} tokens: %{y:.3f}<extra>${esc(title)}</extra>`,
                     error_y: {type: "data", symmetric: false, array: reach.plus, arrayminus: reach.minus,
                               color: d.colours[method], thickness: 1, width: 3}});
      }
      // a row's point at a budget that did not train it: a grey mark off its line, as in the leaderboard's plot
      const flagged = Object.entries(ladder.untrained[title]).filter(([method]) => methods.includes(method));
      if (flagged.length) {
        const points = flagged.flatMap(([method, marks]) => marks.map((mark) => [method, ...mark]));
        traces.push({x: points.map((p) => p[1]), y: points.map((p) => p[2]), text: points.map((p) => esc(p[0])),
                     xaxis: `x${axis}`, yaxis: `y${axis}`, type: "scatter", mode: "markers",
                     marker: {symbol: "x", size: 8, color: "#595959"}, name: "flagged untrained (not compared)",
                     legendgroup: "untrained", showlegend: !shownUntrained,
                     hovertemplate: `%{text}<br>%{x:,} tokens: %{y:.3f} (untrained)<extra>${esc(title)}</extra>`});
        shownUntrained = true;
      }
    });
    Plotly.react(`chart-ladder-${i}`, traces, layout, config);
  });
}

function drawAll(d) {
  const methods = picked();
  drawStabilityPlasticity(d, methods);
  drawCurves(d, methods);
  drawContinual(d, methods);
  drawLadders(d, methods);
}

function picker(d) {
  const boxes = Array.from(document.querySelectorAll("input.pick"));
  boxes.forEach((box) => box.addEventListener("change", () => drawAll(d)));
  document.querySelectorAll("[data-pick]").forEach((button) => button.addEventListener("click", () => {
    const choice = button.dataset.pick;
    boxes.forEach((box) => { box.checked = choice === "all" || (choice === "references" && isReference(d, box.value)); });
    drawAll(d);
  }));
  const select = document.getElementById("matrix-method");
  const naive = d.references.naive_continual;
  if (naive && d.losses[naive]) select.value = naive;  // open on the naive continual reference
  select.addEventListener("change", () => drawMatrices(d));
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("table.board").forEach((table) => { sortableTable(table); filterTable(table); });
  if (document.getElementById("chart-data")) {
    const d = data();
    picker(d);
    drawAll(d);
    drawMatrices(d);
  }
});
