/* report.html's script: draws the page from the JSON document embedded beside it (#report-data),
   written by sbd_bench/analysis/page.py. Hand-written DOM and inline SVG, no library: nothing is
   fetched, the page works from disk. Sections: provenance and banners, task tabs, the leaderboard,
   the accuracy-against-speed plot, the examples with their outputs and decoding timelines. */
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("report-data").textContent);
  // what the reader chose; saved in the address's #fragment (saveState), so a link opens the same view
  const state = { task: 0, speed: "nfe", sort: null, page: 0, filter: "all", hidden: new Set(), example: null,
    trace: null, step: 0 };
  /* One colour-blind-safe scheme, Paul Tol's "muted" (its nine colours stay apart under deuteranopia,
     protanopia and tritanopia); past nine configurations the marker's fill is the second channel:
     solid, hollow, solid with a hole, hollow with a dot (36 configurations told apart, then names). The
     marker's shape says what a configuration is: square NTP, diamond verified, circle the others. */
  const PALETTE = ["#CC6677", "#332288", "#DDCC77", "#117733", "#88CCEE", "#882255", "#44AA99", "#999933", "#AA4499"];
  const FILLS = ["solid", "hollow", "hole", "dot"];
  const SVG_NS = "http://www.w3.org/2000/svg";
  const taskName = () => data.tasks[state.task];
  const configColor = (i) => PALETTE[i % PALETTE.length];
  const configFill = (i) => FILLS[Math.floor(i / PALETTE.length) % FILLS.length];

  // ------------------------------------------------------------------------------------ DOM helpers
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    node.append(...children.filter((c) => c !== null && c !== undefined && c !== false));
    return node;
  }
  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    setAttrs(node, attrs);
    node.append(...children);
    return node;
  }
  function setAttrs(node, attrs) {
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "text") node.textContent = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
  }
  function badges(config) {
    return [config.ntp ? el("span", { class: "badge ntp", text: "NTP", title: "the baseline: one token per forward" }) : null,
      config.verified ? el("span", { class: "badge verified", text: "verified", title: "verify=on: output = NTP's" }) : null,
      config.sampled ? el("span", { class: "badge sampled", text: "sampled",
        title: [config.sampling, config.samples > 1 ? config.samples + " samples per example" : ""].filter(Boolean).join("; ") })
        : null];
  }
  function shapeOf(i) {
    return data.configs[i].ntp ? "square" : data.configs[i].verified ? "diamond" : "circle";
  }
  function shapeNode(shape, x, y, r, attrs) {
    if (shape === "square") return svg("rect", { ...attrs, x: x - r * 0.9, y: y - r * 0.9, width: 1.8 * r, height: 1.8 * r });
    if (shape === "diamond") return svg("path", { ...attrs, d: `M${x},${y - 1.2 * r} L${x + 1.2 * r},${y} L${x},${y + 1.2 * r} L${x - 1.2 * r},${y} Z` });
    return svg("circle", { ...attrs, cx: x, cy: y, r });
  }
  /* Configuration i's marker at (x, y): its colour, shape and fill; ``attrs`` go on the marker's body
     (what the pointer meets), ``halo``: an outline around it that the plot draws on the Pareto front's
     and on the hovered one (a sibling after the body; it and the dot let the pointer through). */
  function markerNodes(i, x, y, r, attrs, halo) {
    const color = configColor(i), fill = configFill(i), shape = shapeOf(i);
    const hollow = fill === "hollow" || fill === "dot";
    const nodes = [shapeNode(shape, x, y, r, { ...attrs, fill: hollow ? "#fff" : color, stroke: hollow ? color : "#fff",
      "stroke-width": hollow ? 2.4 : 1.2 })];
    if (halo) nodes.push(shapeNode(shape, x, y, r + 2.6, { class: "halo" + (halo === "front" ? " on-front" : ""), fill: "none" }));
    if (fill === "hole" || fill === "dot") nodes.push(svg("circle", { class: "dot", cx: x, cy: y, r: r * 0.36, fill: fill === "hole" ? "#fff" : color }));
    return nodes;
  }
  function swatch(i) {
    const node = svg("svg", { class: "swatch", viewBox: "0 0 16 16", width: 14, height: 14, "aria-hidden": "true",
      "data-color": configColor(i), "data-fill": configFill(i), "data-shape": shapeOf(i) }, ...markerNodes(i, 8, 8, 5.6, {}, false));
    return node;
  }


  // --------------------------------------------------------------------------- provenance, banners
  function renderHeader() {
    const details = document.getElementById("provenance"), box = el("div", { class: "grid" });
    const fact = (key) => (data.provenance.find(([k]) => k === key) || [])[1];
    details.append(el("summary", { text: "Run: " + [fact("model_path"), fact("git_commit") && "commit " + String(fact("git_commit")).slice(0, 10),
      fact("device_name") || fact("device"), fact("dtype"), fact("started")].filter(Boolean).join(" · ") + " (details)" }), box);
    for (const [key, value] of data.provenance.concat(data.settings)) {
      const text = Array.isArray(value) ? value.join(", ") : String(value);
      box.append(el("div", { class: key === "command" ? "wide" : null, title: text }, el("b", { text: key + ": " }), text));
    }
    const banner = document.getElementById("banner");
    const say = (text) => banner.append(el("div", { class: "banner", text }));
    if (data.compare) {
      say(`Two runs side by side: ${data.compare[0]} (the baseline) and ${data.compare[1]}, on the examples they share; `
        + "each configuration is CONFIG [RUN], its speed factors against its own run's NTP. The run details are " + data.compare[1] + "'s.");
    }
    if (!data.complete) say("Incomplete run: finish it with `" + (data.resume_command || "python -m sbd_bench run --resume RUN_DIR") + "`.");
    if (data.warning) say("Warning: " + data.warning + ".");
    if (data.note) say(data.note);
    if (data.failures) say(data.failures + " sample(s) failed: see the errors in report.md and summary.json.");
  }

  /* The task tabs, keyboard as the ARIA tabs pattern has it: one tab in the Tab order (the selected
     one), arrow keys, Home and End move to a tab and show it. */
  function selectTask(i) {
    state.task = i; state.page = 0; state.example = null; state.trace = null;
    renderTask();
    saveState();
  }
  function renderTabs() {
    const nav = document.getElementById("tasks");
    const select = selectTask;
    data.tasks.forEach((task, i) => nav.append(el("button", {
      type: "button", role: "tab", "data-task": task, text: task, id: "tab-" + i, "aria-controls": "task-panel",
      onclick: () => select(i),
      onkeydown: (e) => {
        const n = data.tasks.length;
        const to = { ArrowRight: (i + 1) % n, ArrowLeft: (i - 1 + n) % n, Home: 0, End: n - 1 }[e.key];
        if (to === undefined) return;
        e.preventDefault();
        select(to);
        document.getElementById("tab-" + to).focus();
      },
    })));
  }

  // ------------------------------------------------------------------------- cross-task summary
  /* report.md's main table (configurations x tasks, "accuracy / NFE speed factor"), the headline above
     it, the CSV files beside the page, and "copy as Markdown" of it or of the task's leaderboard. */
  function markdownTable(header, body) {
    const line = (cells) => "| " + cells.map((c) => String(c).replace(/\|/g, "\\|")).join(" | ") + " |";
    return [line(header), "|" + header.map(() => "---|").join(""), ...body.map(line)].join("\n");
  }
  function summaryMarkdown() {
    return markdownTable(["config", ...data.tasks], data.matrix.map(([i, ...cells]) => [data.configs[i].name, ...cells]));
  }
  function boardMarkdown() {
    return markdownTable(["config", ...data.columns.map((c) => c.label)], sortedRows().map((r) => [data.configs[r.config].name,
      ...data.columns.map((c) => r.texts[c.key] + (r.intervals[c.key] ? " " + r.intervals[c.key] : ""))]));
  }
  function copyText(text, what) {
    const box = document.getElementById("copied");
    box.hidden = false;
    box.value = text;
    box.dataset.what = what;
    box.select();
    const said = document.getElementById("copy-status");
    const done = () => { said.textContent = `${what} copied as Markdown (also in the box below)`; };
    if (navigator.clipboard && navigator.clipboard.writeText) {
      navigator.clipboard.writeText(text).then(done, () => { said.textContent = `${what} as Markdown in the box below: the browser refused the clipboard`; });
    } else {
      try { document.execCommand("copy"); done(); } catch (e) { said.textContent = `${what} as Markdown in the box below`; }
    }
  }
  function renderSummary() {
    document.getElementById("headline").textContent = data.headline;
    const table = document.getElementById("matrix");
    table.append(el("thead", {}, el("tr", {}, el("th", { text: "config", scope: "col" }),
      ...data.tasks.map((task, t) => el("th", { scope: "col" }, el("button", { type: "button", class: "to-task", "data-task": task,
        text: task, title: `show ${task}'s leaderboard, plot and examples`,
        onclick: () => { selectTask(t); document.getElementById("leaderboard").scrollIntoView(); } }))))));
    table.append(el("tbody", {}, ...data.matrix.map(([i, ...cells]) => el("tr", { "data-config": data.configs[i].name,
      class: data.configs[i].ntp ? "ntp" : null },
    el("td", {}, swatch(i), data.configs[i].name, ...badges(data.configs[i])), ...cells.map((c) => el("td", { text: c }))))));
    const tools = document.getElementById("summary-links");
    if (data.links.length) {
      tools.append("Beside this page: ", ...data.links.flatMap((name, k) => [k ? ", " : "", el("a", { href: name, text: name })]), ". ");
    }
    tools.append("Copy as Markdown: ",
      el("button", { type: "button", class: "copy-summary", text: "this summary", onclick: () => copyText(summaryMarkdown(), "the summary") }), " ",
      el("button", { type: "button", class: "copy-board", text: "the task's leaderboard", onclick: () => copyText(boardMarkdown(), taskName() + "'s leaderboard") }),
      el("span", { id: "copy-status", class: "hint", role: "status" }),
      el("textarea", { id: "copied", readonly: true, hidden: true, rows: 6, "aria-label": "the copied Markdown" }));
  }

  // ------------------------------------------------------------------------------------ leaderboard
  function sortValue(row, key) {
    return key === "config" ? data.configs[row.config].name : row.values[key];
  }
  function sortedRows() {
    const rows = data.rows.filter((r) => r.task === state.task);
    if (!state.sort) return rows;  // the report's order: NTP first, then the run's
    const { key, dir } = state.sort;
    return rows.slice().sort((a, b) => {
      const x = sortValue(a, key), y = sortValue(b, key);
      if (x === null || x === undefined) return (y === null || y === undefined) ? 0 : 1;  // no value: last either way
      if (y === null || y === undefined) return -1;
      const order = typeof x === "string" ? x.localeCompare(y) : x - y;
      return dir === "ascending" ? order : -order;
    });
  }
  function sortBy(key) {
    const same = state.sort && state.sort.key === key;
    const first = key === "config" ? "ascending" : "descending";  // figures: the largest first
    state.sort = { key, dir: same ? (state.sort.dir === "ascending" ? "descending" : "ascending") : first };
    const focused = document.activeElement && document.activeElement.closest("#board th");
    renderBoard();
    saveState();
    if (focused) document.querySelector(`#board th[data-key="${key}"] button`).focus();  // the table was redrawn
  }
  function renderBoard() {
    const table = document.getElementById("board");
    table.textContent = "";
    const columns = [{ key: "config", label: "config", title: "solver configuration" }].concat(data.columns);
    // each header holds a button: focusable, and Enter or Space clicks it (the click reaches the header)
    table.append(el("thead", {}, el("tr", {}, ...columns.map((c) => el("th", {
      "data-key": c.key, title: c.title, scope: "col",
      "aria-sort": state.sort && state.sort.key === c.key ? state.sort.dir : "none", onclick: () => sortBy(c.key),
    }, el("button", { type: "button", class: "sort", text: c.label }))))));
    const body = el("tbody");
    let marked = false;
    for (const row of sortedRows()) {
      const config = data.configs[row.config];
      const tr = el("tr", { class: config.ntp ? "ntp" : null, "data-config": config.name, "data-task": taskName() },
        el("td", { "data-key": "config" }, swatch(row.config), config.name, ...badges(config)));
      for (const c of data.columns) {
        const value = row.values[c.key];
        const mark = row.length_differs && c.marked;
        marked = marked || mark;
        tr.append(el("td", { "data-key": c.key, "data-value": value === null ? "" : String(value) },
          el("span", { class: "value", text: row.texts[c.key] }),
          mark ? el("span", { class: "mark", text: " †", title: data.length_note }) : null,
          row.intervals[c.key] ? el("span", { class: "ci", text: row.intervals[c.key] }) : null));
      }
      body.append(tr);
    }
    table.append(body);
    document.getElementById("board-note").textContent = marked ? data.length_note : "";
  }

  // ------------------------------------------------------------------------------------------- plot
  function niceStep(span, most) {
    for (const base of [0.1, 0.2, 0.25, 0.5, 1, 2, 2.5, 5, 10, 20, 25, 50, 100, 200, 500, 1000]) {
      if (span / base <= most) return base;
    }
    return Math.pow(10, Math.ceil(Math.log10(span / most)));
  }
  function renderPlot() {
    for (const button of document.querySelectorAll("#plot .switch button")) {
      button.setAttribute("aria-pressed", String(button.dataset.speed === state.speed));
    }
    const area = document.getElementById("plot-area");
    area.textContent = "";
    const key = "speed_factor_" + state.speed;
    const drawable = data.rows.filter((r) => r.task === state.task && r.values.accuracy !== null && r.values[key] !== null);
    const points = drawable.filter((r) => !state.hidden.has(r.config));  // the legend hides and shows configurations
    // drawn at the width it is shown at (780 at most), so that its text stays 11 px on a phone too
    const W = Math.round(Math.max(300, Math.min(780, area.clientWidth || 780))), H = Math.round(Math.min(430, 0.62 * W + 90));
    const m = { l: 52, r: 16, t: 14, b: 46 };
    const xMax = Math.max(1, ...points.map((r) => Math.max(r.values[key], r.bounds[key] ? r.bounds[key][1] : 0))) * 1.08;
    const X = (v) => m.l + (v / xMax) * (W - m.l - m.r);
    const Y = (v) => m.t + (1 - (v + 4) / 108) * (H - m.t - m.b);  // -4%..104%: room for markers at 0 and 100
    const plot = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img",
      "aria-label": `accuracy against ${state.speed} speed factor, ${taskName()}` });
    const grid = svg("g", { class: "grid" }), axis = svg("g", { class: "axis" });
    const step = niceStep(xMax, W < 520 ? 5 : 10);
    for (let v = 0; v <= xMax + 1e-9; v += step) {
      grid.append(svg("line", { x1: X(v), x2: X(v), y1: Y(-4), y2: Y(104) }));
      axis.append(svg("text", { x: X(v), y: H - m.b + 16, "text-anchor": "middle" }, document.createTextNode(+v.toFixed(2) + "x")));
    }
    for (let v = 0; v <= 100; v += 20) {
      grid.append(svg("line", { x1: X(0), x2: X(xMax), y1: Y(v), y2: Y(v) }));
      axis.append(svg("text", { x: m.l - 8, y: Y(v) + 4, "text-anchor": "end" }, document.createTextNode(v)));
    }
    axis.append(svg("path", { d: `M${X(0)},${Y(-4)} H${X(xMax)} M${X(0)},${Y(-4)} V${Y(104)}`, fill: "none" }));
    axis.append(svg("line", { x1: X(1), x2: X(1), y1: Y(-4), y2: Y(104), "stroke-dasharray": "2 3" }));
    const speedName = state.speed === "nfe" ? "NFE" : "wall-clock, decode";
    axis.append(svg("text", { x: (X(0) + X(xMax)) / 2, y: H - 8, "text-anchor": "middle" },
      document.createTextNode(W < 520 ? `speed factor vs NTP (${state.speed === "nfe" ? "NFE" : "wall"}); dotted: 1x`
        : `speed factor relative to NTP (${speedName}); dotted: NTP, 1x`)));
    axis.append(svg("text", { x: 14, y: (Y(0) + Y(100)) / 2, "text-anchor": "middle",
      transform: `rotate(-90 14 ${(Y(0) + Y(100)) / 2})` }, document.createTextNode("accuracy (%)")));
    plot.append(grid, axis);
    const frontNames = new Set(data.fronts[state.speed][taskName()] || []);
    const front = points.filter((r) => frontNames.has(data.configs[r.config].name))
      .sort((a, b) => a.values[key] - b.values[key]);
    if (front.length) {
      plot.append(svg("polyline", { class: "front",
        points: front.map((r) => `${X(r.values[key])},${Y(100 * r.values.accuracy)}`).join(" ") }));
    }
    for (const r of points) {  // 95% intervals as whiskers, under the markers
      const color = configColor(r.config), x = X(r.values[key]), y = Y(100 * r.values.accuracy);
      const speed = r.bounds[key], accuracy = r.bounds.accuracy;
      if (speed) plot.append(svg("line", { class: "whisker", "data-config": data.configs[r.config].name, "data-axis": "x",
        stroke: color, x1: X(speed[0]), x2: X(speed[1]), y1: y, y2: y }));
      if (accuracy) plot.append(svg("line", { class: "whisker", "data-config": data.configs[r.config].name, "data-axis": "y",
        stroke: color, x1: x, x2: x, y1: Y(100 * accuracy[0]), y2: Y(100 * accuracy[1]) }));
    }
    const ntpLast = points.slice().sort((a, b) => data.configs[a.config].ntp - data.configs[b.config].ntp);
    for (const r of ntpLast) {  // NTP drawn last: on top of a configuration at its spot (1x, same accuracy)
      const config = data.configs[r.config], x = X(r.values[key]), y = Y(100 * r.values.accuracy);
      plot.append(...markerNodes(r.config, x, y, 6.5, { class: "point" + (frontNames.has(config.name) ? " on-front" : ""),
        "data-config": config.name, "data-color": configColor(r.config), "data-fill": configFill(r.config), tabindex: 0,
        onmouseenter: (e) => showTooltip(e, r, points, X, Y), onmousemove: (e) => moveTooltip(e),
        onmouseleave: hideTooltip, onfocus: (e) => showTooltip(e, r, points, X, Y), onblur: hideTooltip },
      frontNames.has(config.name) ? "front" : "other"));
    }
    if (!points.length) {
      plot.append(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, document.createTextNode("no verdicts")));
    }
    area.append(plot);
    const legend = el("div", { class: "legend", role: "group", "aria-label": "configurations shown in the plot" });
    for (const r of drawable) {
      const shown = !state.hidden.has(r.config);
      legend.append(el("button", { type: "button", class: "legend-entry", "data-config": data.configs[r.config].name,
        "aria-pressed": String(shown), title: (shown ? "hide " : "show ") + data.configs[r.config].name,
        onclick: () => { if (shown) state.hidden.add(r.config); else state.hidden.delete(r.config); renderPlot(); saveState(); } },
      swatch(r.config), data.configs[r.config].name));
    }
    if (state.hidden.size) {
      legend.append(el("button", { type: "button", class: "legend-all", text: `show all (${drawable.length - points.length} hidden)`,
        onclick: () => { state.hidden.clear(); renderPlot(); saveState(); } }));
    }
    legend.append(el("span", { text: "click a name to hide or show it; ■ NTP; ◆ verified; dashed: the Pareto front of all configurations, ringed: on it; "
      + "lines: 95% intervals; hover a marker for its figures" }));
    area.append(legend);
  }
  function tooltipLines(r) {
    // the leaderboard's names and texts (columns.COLUMNS) of the figures the plot is about
    const label = Object.fromEntries(data.columns.map((c) => [c.key, c.label]));
    return ["accuracy", "speed_factor_nfe", "speed_factor_wall", "tokens_per_forward", "nfe", "n"].map((k) =>
      [label[k], r.texts[k] + (r.intervals[k] ? " " + r.intervals[k] : "")]);
  }
  function showTooltip(event, r, points, X, Y) {
    const tip = document.getElementById("tooltip");
    const key = "speed_factor_" + state.speed, config = data.configs[r.config];
    const near = points.filter((o) => o !== r && Math.hypot(X(o.values[key]) - X(r.values[key]),
      Y(100 * o.values.accuracy) - Y(100 * r.values.accuracy)) < 9);
    const onFront = (data.fronts[state.speed][taskName()] || []).includes(config.name);
    tip.textContent = "";
    tip.append(...[el("div", { class: "name" }, config.name, ...badges(config)),
      onFront ? el("div", { text: "on the Pareto front (" + (state.speed === "nfe" ? "NFE" : "wall-clock") + ")" }) : null,
      el("table", {}, ...tooltipLines(r).map(([k, v]) => el("tr", {}, el("td", { text: k }), el("td", { text: v })))),
      near.length ? el("div", { text: "also here: " + near.map((o) => data.configs[o.config].name).join(", ") }) : null,
    ].filter(Boolean));
    tip.hidden = false;
    event.target.classList.add("hover");
    moveTooltip(event);
  }
  function moveTooltip(event) {
    const tip = document.getElementById("tooltip");
    const box = event.target.getBoundingClientRect();
    const x = event.pageX || box.right + window.scrollX, y = event.pageY || box.bottom + window.scrollY;
    tip.style.left = Math.min(x + 14, window.scrollX + document.documentElement.clientWidth - tip.offsetWidth - 8) + "px";
    // below the pointer, or above it where the window ends first
    const below = y + 14 + tip.offsetHeight <= window.scrollY + document.documentElement.clientHeight - 4;
    tip.style.top = (below ? y + 14 : Math.max(window.scrollY + 4, y - 14 - tip.offsetHeight)) + "px";
  }
  function hideTooltip(event) {
    document.getElementById("tooltip").hidden = true;
    event.target.classList.remove("hover");
  }

  // -------------------------------------------------------------------------------- text differences
  /* Myers' O(ND) difference of two strings (Myers 1986), as [op, text] runs: "=" both, "-" only in a
     (NTP's output), "+" only in b. Past ``limit`` edits the two are shown as replaced whole. */
  function diff(a, b, limit = 400) {
    if (a === b) return a ? [["=", a]] : [];
    const n = a.length, m = b.length, off = n + m + 1;
    const v = new Int32Array(2 * off + 2);
    const trace = [];
    for (let d = 0; d <= n + m; d++) {
      if (d > limit) return [["-", a], ["+", b]];
      trace.push(v.slice(off - d - 1, off + d + 2));  // v before step d, diagonals -d-1..d+1
      for (let k = -d; k <= d; k += 2) {
        let x = (k === -d || (k !== d && v[off + k - 1] < v[off + k + 1])) ? v[off + k + 1] : v[off + k - 1] + 1;
        let y = x - k;
        while (x < n && y < m && a[x] === b[y]) { x++; y++; }
        v[off + k] = x;
        if (x >= n && y >= m) return backtrack(trace, a, b, d, k);
      }
    }
    return [["-", a], ["+", b]];
  }
  function backtrack(trace, a, b, d, k) {
    const ops = [];
    let x = a.length, y = b.length;
    for (; d > 0; d--) {
      const V = trace[d], at = (kk) => V[kk + d + 1];
      const down = k === -d || (k !== d && at(k - 1) < at(k + 1));
      const prevK = down ? k + 1 : k - 1, prevX = at(prevK);
      const startX = down ? prevX : prevX + 1, startY = startX - k;
      while (x > startX && y > startY) { ops.push(["=", a[x - 1]]); x--; y--; }
      if (down) { ops.push(["+", b[y - 1]]); y--; } else { ops.push(["-", a[x - 1]]); x--; }
      k = prevK;
    }
    while (x > 0 && y > 0) { ops.push(["=", a[x - 1]]); x--; y--; }
    const runs = [];
    for (const [op, ch] of ops.reverse()) {
      if (runs.length && runs[runs.length - 1][0] === op) runs[runs.length - 1][1] += ch;
      else runs.push([op, ch]);
    }
    return runs;
  }
  function diffNode(base, text) {
    const node = el("div", { class: "output" });
    for (const [op, part] of diff(base, text)) {
      node.append(op === "=" ? document.createTextNode(part)
        : el(op === "+" ? "ins" : "del", { text: part, title: op === "+" ? "not in NTP's output" : "in NTP's output only" }));
    }
    return node;
  }

  // --------------------------------------------------------------------------------------- examples
  function tracesOf(ex) {
    return data.traces.filter((t) => t.task === taskName() && t.id === ex.id);
  }
  /* An example's cell per configuration: null (not decoded) or its samples, each
     [sample, correct, nfe, tokens, output text or null, error or null]. */
  const S = { index: 0, correct: 1, nfe: 2, tokens: 3, text: 4, error: 5 };
  function baseSample(ex, i, sample) {  // NTP's sample at the same settings and index (else its first)
    const base = data.configs[i].base === null || data.configs[i].base === i ? null : ex.cells[data.configs[i].base];
    return base ? base.find((b) => b[S.index] === sample[S.index]) || base[0] : null;
  }
  function differsFromNtp(ex) {
    return ex.cells.some((cell, i) => cell && cell.some((sample) => {
      const base = baseSample(ex, i, sample);
      return base && sample[S.text] !== null && base[S.text] !== null && sample[S.text] !== base[S.text];
    }));
  }
  const isWrong = (sample) => sample[S.correct] === false || !!sample[S.error];
  const FILTERS = {
    all: ["all examples", () => true],
    wrong: ["some configuration wrong", (ex) => ex.cells.some((cell) => cell && cell.some(isWrong))],
    differs: ["output differs from NTP's", differsFromNtp],
    traced: ["traced (decoding timeline)", (ex) => ex.traced],
  };
  /* [label, test] of a filter: one of FILTERS, or "wrong:I", the examples where configuration I has a
     wrong or failed sample. */
  function filterOf(key) {
    if (key.startsWith("wrong:")) {
      const i = +key.slice(6), config = data.configs[i];
      if (config) return [config.name + " wrong", (ex) => !!ex.cells[i] && ex.cells[i].some(isWrong)];
    }
    return FILTERS[key] || FILTERS.all;
  }
  function renderExamples() {
    const all = data.examples[taskName()] || [];
    const shown = all.filter(filterOf(state.filter)[1]);
    const pages = Math.max(1, Math.ceil(shown.length / data.per_page));
    state.page = Math.min(state.page, pages - 1);
    const controls = document.getElementById("example-controls");
    controls.textContent = "";
    const select = el("select", { id: "example-filter", "aria-label": "which examples",
      onchange: (e) => { state.filter = e.target.value; state.page = 0; state.example = null; renderExamples(); saveState(); } },
      ...Object.entries(FILTERS).map(([key, [label]]) => el("option", { value: key, text: label, selected: key === state.filter })),
      el("optgroup", { label: "this configuration wrong" }, ...data.configs.map((config, i) => ({ config, i }))
        .filter(({ i }) => all.some((ex) => ex.cells[i])).map(({ config, i }) => el("option", { value: "wrong:" + i,
          text: config.name + " wrong", selected: "wrong:" + i === state.filter }))));
    const go = (page) => { state.page = page; state.example = null; renderExamples(); saveState(); };
    controls.append(select, el("div", { class: "pager" },
      el("button", { type: "button", class: "prev", text: "◀", disabled: state.page === 0, onclick: () => go(state.page - 1) }),
      el("span", { class: "page-label", text: `page ${state.page + 1} of ${pages}` }),
      el("button", { type: "button", class: "next", text: "▶", disabled: state.page >= pages - 1, onclick: () => go(state.page + 1) })),
    el("span", { class: "hint", text: `${shown.length} of ${all.length} examples; a square per configuration `
      + "(✓ correct, ✗ wrong, – no verdict, ! error, empty: not decoded); click an example for its outputs" }));
    if (data.omitted) {
      controls.append(el("span", { class: "hint", text: `${data.omitted} example(s) show verdicts only: the page holds `
        + `at most ${data.output_budget.toLocaleString("en")} characters of output (traced examples always); samples.jsonl has every output` }));
    }
    const list = document.getElementById("example-list");
    list.textContent = "";
    for (const ex of shown.slice(state.page * data.per_page, (state.page + 1) * data.per_page)) list.append(exampleNode(ex));
    if (!shown.length) {
      list.append(el("p", { class: "empty", text: all.length ? `No example of ${taskName()} is "${filterOf(state.filter)[0]}": choose "all examples" to see all ${all.length}.`
        : `This run holds no example of ${taskName()}.` }));
    }
  }
  /* A verdict square's kind, and the glyph that tells it apart without colour. */
  const VERDICTS = { true: "✓", false: "✗", null: "–", error: "!", none: "" };
  function verdictKind(sample) {
    if (!sample) return "none";
    if (sample[S.error]) return "error";
    return sample[S.correct] === null ? "null" : String(sample[S.correct]);
  }
  function verdictSquare(kind, title) {
    return el("span", { class: "v v-" + kind, title, "data-verdict": kind, text: VERDICTS[kind] });
  }
  function verdictText(sample) {
    if (!sample) return "not decoded";
    if (sample[S.error]) return "error: " + sample[S.error];
    return sample[S.correct] === null ? "no verdict" : sample[S.correct] ? "correct" : "wrong";
  }
  /* An example's squares: one per sample of each configuration, a configuration's samples side by side. */
  function verdictNodes(ex) {
    return ex.cells.map((cell, i) => {
      const name = data.configs[i].name;
      const squares = cell ? cell.map((sample) => verdictSquare(verdictKind(sample),
        name + (cell.length > 1 || data.configs[i].samples > 1 ? ` sample ${sample[S.index]}` : "") + ": " + verdictText(sample)))
        : [verdictSquare("none", name + ": not decoded")];
      const right = cell ? cell.filter((sample) => sample[S.correct] === true).length : 0;
      return el("span", { class: "vgroup", "data-config": name, title: cell && cell.length > 1 ? `${name}: ${right} of ${cell.length} samples correct` : null },
        ...squares);
    });
  }
  function exampleNode(ex) {
    const node = el("div", { class: "example", "data-id": ex.id });
    const detail = el("div", { class: "detail", hidden: true });
    const summary = el("div", { class: "summary", role: "button", tabindex: 0, "aria-expanded": "false",
      onclick: () => toggle(), onkeydown: (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); toggle(); } } },
    el("span", { class: "eid", text: ex.id }),
    el("span", { class: "verdicts" }, ...verdictNodes(ex)),
    ex.traced ? el("span", { class: "badge verified", text: "traced" }) : null,
    ex.full ? null : el("span", { class: "hint", text: "verdicts only" }));
    function toggle(quiet) {
      const open = detail.hidden;
      if (open && !detail.childElementCount) fillDetail(ex, detail);
      detail.hidden = !open;
      summary.setAttribute("aria-expanded", String(open));
      if (quiet) return;
      if (open) { state.example = ex.id; state.trace = null; } else if (state.example === ex.id) { state.example = null; state.trace = null; }
      saveState();
    }
    node.open = () => toggle(true);
    node.append(summary, detail);
    return node;
  }
  function fillDetail(ex, detail) {
    if (ex.prompt !== null) detail.append(el("div", { class: "hint", text: "prompt" }), el("div", { class: "prompt", text: ex.prompt }));
    else if (ex.full) detail.append(el("div", { class: "hint", text: "prompt: not in this run's records (written before records held the prompt)" }));
    if (ex.answer !== null) detail.append(el("div", { class: "hint" }, "reference answer: ", el("code", { text: ex.answer })));
    const traces = tracesOf(ex);
    const table = el("table", { class: "outputs" }, el("tr", {}, ...["config", "verdict", "nfe", "tokens",
      "output (against NTP's: inserted, deleted)"].map((h) => el("th", { text: h }))));
    const timelineBox = el("div", { class: "timeline-box" });
    ex.cells.forEach((cell, i) => (cell || []).forEach((sample) => {
      const config = data.configs[i], base = baseSample(ex, i, sample), several = cell.length > 1 || config.samples > 1;
      let output;
      if (sample[S.error]) output = el("div", { class: "no", text: "error: " + sample[S.error] });
      else if (sample[S.text] === null) output = el("span", { class: "hint", text: "not embedded (see samples.jsonl)" });
      else if (base && base[S.text] !== null) output = diffNode(base[S.text], sample[S.text]);
      else output = el("div", { class: "output", text: sample[S.text] });
      const mine = traces.filter((t) => t.config === i && (t.sample || 0) === sample[S.index]);
      const correct = sample[S.correct];
      table.append(el("tr", { "data-config": config.name, "data-sample": sample[S.index] },
        el("td", { class: "cfg" }, swatch(i), config.name, ...badges(config),
          several ? el("span", { class: "sample", text: ` sample ${sample[S.index]}` }) : null,
          ...mine.map((t) => el("button", { type: "button", class: "show-timeline", text: "timeline",
            "data-trace": traceId(t), onclick: () => openTimeline(t, 0) }))),
        el("td", { class: correct ? "ok" : correct === false ? "no" : "", text: correct === null ? "–" : correct ? "✓" : "✗",
          title: verdictText(sample) }),
        el("td", { text: sample[S.nfe] === null ? "–" : sample[S.nfe] }), el("td", { text: sample[S.tokens] === null ? "–" : sample[S.tokens] }),
        el("td", {}, output)));
    }));
    detail.append(table, timelineBox);
    function openTimeline(t, step) {
      state.example = ex.id;
      state.trace = traceId(t);
      timelineBox.textContent = "";
      timelineBox.append(timeline(t, step));  // saves the state with its first step
    }
    detail.openTimeline = (id, step) => {
      const t = traces.find((tr) => traceId(tr) === id);
      if (t) { openTimeline(t, step); return true; }
      return false;
    };
  }

  // ------------------------------------------------------------------------------ decoding timeline
  const RAMP = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];  // viridis
  function forwardColor(n, total) {
    const t = total > 1 ? (n - 1) / (total - 1) : 0, at = t * (RAMP.length - 1), i = Math.min(Math.floor(at), RAMP.length - 2);
    const c = RAMP[i].map((v, j) => Math.round(v + (RAMP[i + 1][j] - v) * (at - i)));
    return { background: `rgb(${c.join(",")})`, color: t > 0.55 ? "#111" : "#fff" };
  }
  function piece(id) {
    if (id < 0) return "▢";
    const text = data.pieces[String(id)];
    if (text === undefined) return "#" + id;
    return text === "" ? "∅" : text.replace(/ /g, "␣").replace(/\n/g, "↵").replace(/\t/g, "⇥");
  }
  function proxies(f, slot) {
    if (!f || f.entropy[slot] === null || f.entropy[slot] === undefined) return "";
    return ` · entropy ${f.entropy[slot]} · confidence ${f.confidence[slot]}`;
  }
  /* The decode as it stood after ``step`` forwards: the committed output, each token with the forward
     that revealed it (NTP's forward for a replaced draft), and the forward's own block. */
  function replay(trace, step) {
    const out = [], revealedBy = new Map();
    let before = null, rejected = null;
    for (let i = 0; i < step; i++) {
      const f = trace.forwards[i];
      const isVoid = f.kind === "verify" && f.rejected_slot !== null && f.rejected_slot !== undefined;
      let replacedAt = -1;
      if (isVoid && before) {
        replacedAt = before.start + f.rejected_slot;
        revealedBy.set(replacedAt, { f, slot: null });  // NTP's token, read from this forward
        // the drafts judged are slots 1..drafted (slot 0 was committed by the block's own forward): what
        // sat after them (padding past a drafted stop) was never a draft
        if (i === step - 1) rejected = { at: replacedAt, drafts: before.tokens.slice(f.rejected_slot, f.drafted + 1) };
      }
      if (!isVoid) for (const slot of f.revealed) revealedBy.set(f.start + slot, { f, slot });
      for (const id of f.committed) {
        const at = out.length, by = revealedBy.get(at) || { f, slot: null };
        out.push({ id, by: by.f.n, f: by.f, slot: by.slot, replaced: at === replacedAt });
      }
      before = f;
    }
    return { out, current: step ? trace.forwards[step - 1] : null, previous: step > 1 ? trace.forwards[step - 2] : null, rejected };
  }
  const traceId = (t) => data.configs[t.config].name + "@" + (t.sample || 0);
  function timeline(trace, initialStep) {
    const total = trace.forwards.length, config = data.configs[trace.config];
    const finalLength = trace.forwards.reduce((s, f) => s + f.committed.length, 0);
    const box = el("div", { class: "timeline", "data-config": config.name, "data-forwards": total, "data-step": 0 });
    const label = el("span", { class: "step-label" });
    const slider = el("input", { type: "range", min: 0, max: total, value: 0, "aria-label": "forward",
      oninput: (e) => show(+e.target.value) });
    let timer = null;
    const play = el("button", { type: "button", class: "play", text: "play", onclick: () => {
      if (timer) { stop(); return; }
      if (+slider.value >= total) show(0);
      play.textContent = "pause";
      timer = setInterval(() => (+slider.value >= total ? stop() : show(+slider.value + 1)), 700);
    } });
    function stop() { clearInterval(timer); timer = null; play.textContent = "play"; }
    const info = el("div", { class: "step-info" }), tokens = el("div", { class: "tokens" });
    box.append(el("div", { class: "hint" }, `Decoding of example ${trace.id}${trace.sample ? " (sample " + trace.sample + ")" : ""} by `,
      el("b", { text: config.name }), `: ${total} forwards, block size ${trace.block_size}. Tokens are coloured by the forward that revealed them; `
      + "the outlined ones by this forward; dashed: revealed but not yet committed (drafts of a verified block); "
      + "struck red: revoked or rejected; struck grey: a block voided by a rejection."),
    el("div", { class: "controls" },
      el("button", { type: "button", class: "first", text: "◀◀", title: "before the first forward", onclick: () => show(0) }),
      el("button", { type: "button", class: "prev", text: "◀", title: "previous forward", onclick: () => show(Math.max(0, +slider.value - 1)) }),
      slider,
      el("button", { type: "button", class: "next", text: "▶", title: "next forward", onclick: () => show(Math.min(total, +slider.value + 1)) }),
      el("button", { type: "button", class: "last", text: "▶▶", title: "after the last forward", onclick: () => show(total) }),
      play, label),
    info, tokens, scaleNode(total));
    if (trace.problems.length) box.append(el("div", { class: "problems", text: "This trace disagrees with its record: " + trace.problems.join("; ") }));
    function cell(cls, id, title, style, index) {
      const node = el("span", { class: "tok " + cls, title, "data-index": index }, piece(id), el("span", { class: "idx", text: index === undefined ? "" : index }));
      if (style) { node.style.background = style.background; node.style.color = style.color; }
      return node;
    }
    function show(step) {
      if (state.trace === traceId(trace)) { state.step = step; saveState(); }
      slider.value = step;
      box.dataset.step = step;
      label.textContent = `forward ${step} of ${total}`;
      const { out, current: f, previous, rejected } = replay(trace, step);
      tokens.textContent = "";
      out.forEach((t, i) => {
        const title = `output ${i} · token ${t.id} "${piece(t.id)}" · revealed by forward ${t.by}` + proxies(t.f, t.slot)
          + (t.replaced ? " · NTP's token in place of a rejected draft" : "");
        tokens.append(cell((t.by === step ? "now" : "") + (t.replaced ? " replaced" : ""), t.id, title, forwardColor(t.by, total), i));
      });
      if (rejected) {
        rejected.drafts.forEach((id, j) => tokens.append(cell("rejected", id, j === 0 ? "draft rejected by NTP" : "draft dropped after the rejected one")));
      }
      let shown = out.length;
      if (f && f.size) {
        const isVoid = f.kind === "verify" && f.rejected_slot !== null && f.rejected_slot !== undefined;
        const same = previous && previous.start === f.start && previous.size === f.size && previous.kind !== "ntp";
        const ended = f.kind === "block" && f.committed.length > 0;  // the block is committed: what is left fell after a stop
        for (let slot = 0; slot < f.size; slot++) {
          const index = f.start + slot;
          if (!isVoid && index < out.length) continue;  // committed already (a verify block's first slot)
          const id = f.tokens[slot];
          if (isVoid) { tokens.append(cell("void", id, "void: this block sat after the rejected draft", null, index)); continue; }
          if (ended && id >= 0) { tokens.append(cell("void", id, `output ${index} · after the stop: dropped`, null, index)); continue; }
          if (f.revoked.includes(slot)) {
            const was = same ? previous.tokens[slot] : -1;
            tokens.append(cell("revoked", was, `output ${index} · revoked by forward ${f.n}: masked again`, null, index));
            continue;
          }
          if (id < 0) { tokens.append(cell("masked", id, `output ${index} · masked` + proxies(f, slot), null, index)); continue; }
          if (index >= finalLength) continue;  // a draft past the answer's end (after a drafted stop): never judged
          const by = revealer(trace, step, index);
          tokens.append(cell("draft" + (by.n === step ? " now" : ""), id, `output ${index} · token ${id} "${piece(id)}" · revealed by forward ${by.n}, not committed yet`
            + proxies(by, slot), forwardColor(by.n, total), index));
        }
        shown = Math.max(shown, f.start + f.size);
      }
      for (let i = shown; i < finalLength; i++) tokens.append(cell("future", -1, "not decoded yet", null, i));
      info.textContent = step ? describe(f, previous, out, total) : "Before the first forward: the prompt is in the cache, nothing is revealed.";
    }
    state.step = Math.max(0, Math.min(total, initialStep || 0));
    show(state.step);
    return box;
  }
  function revealer(trace, step, index) {
    for (let i = step - 1; i >= 0; i--) {
      const f = trace.forwards[i];
      if (f.revealed.some((slot) => f.start + slot === index)) return f;
    }
    return trace.forwards[step - 1];
  }
  function describe(f, previous, out, total) {
    const kinds = { ntp: "NTP forward", block: "block forward", verify: "verify forward (a verified block's first)" };
    const list = (slots) => slots.map((s) => `${f.start + s} "${piece(f.tokens[s])}"` + (f.entropy[s] !== null ? ` (H=${f.entropy[s]})` : "")).join(", ");
    const parts = [`Forward ${f.n} of ${total}: ${kinds[f.kind]}`];
    if (f.size) parts.push(`block at output ${f.start}–${f.start + f.size - 1} (${f.size} slots, ${f.masked.length} masked when it ran)`);
    else parts.push("no block of its own: it checks the previous block's drafts, which reached a stop");
    if (f.kind === "verify" && f.drafted) {
      const rejectedText = f.rejected_slot === null || f.rejected_slot === undefined ? "" : previous
        ? `; the draft "${piece(previous.tokens[f.rejected_slot])}" at output ${previous.start + f.rejected_slot} rejected, NTP's token taken instead`
          + (f.size ? ": this forward's block is void" : "") + `; ${f.drafted - f.accepted - 1} later draft(s) dropped`
        : "; a draft rejected";
      parts.push(`judged ${f.drafted} draft(s) of the previous block: ${f.accepted} accepted${rejectedText}`);
    }
    if (f.revealed.length) parts.push(`revealed ${f.revealed.length}: ${list(f.revealed)}`);
    if (f.revoked.length) parts.push(`revoked ${f.revoked.length}: ${f.revoked.map((s) => f.start + s).join(", ")}`);
    parts.push(f.committed.length ? `committed ${f.committed.length} token(s): "${f.committed.map(piece).join("")}"` : "committed nothing");
    parts.push(`output so far: ${out.length} token(s)`);
    return parts.join(" · ");
  }
  function scaleNode(total) {
    const stops = RAMP.map((c, i) => `rgb(${c.join(",")}) ${(100 * i) / (RAMP.length - 1)}%`).join(", ");
    return el("div", { class: "scale" }, "forward 1", el("span", { class: "bar", style: `background: linear-gradient(to right, ${stops})` }),
      `forward ${total}`);
  }

  // ------------------------------------------------------------------------------------------- page
  /* The view as an address fragment: #task=arith&sort=nfe:descending&speed=wall&filter=wrong:2&hide=3,5
     &example=7&trace=fixed_k:k=2@0&step=3 (only what differs from the page as it opens). */
  function saveState() {
    const p = new URLSearchParams();
    if (state.task) p.set("task", taskName());
    if (state.sort) p.set("sort", state.sort.key + ":" + state.sort.dir);
    if (state.speed !== "nfe") p.set("speed", state.speed);
    if (state.filter !== "all") p.set("filter", state.filter);
    if (state.hidden.size) p.set("hide", [...state.hidden].map((i) => data.configs[i].name).join("|"));
    if (state.page) p.set("page", state.page + 1);
    if (state.example !== null) p.set("example", state.example);
    if (state.example !== null && state.trace) { p.set("trace", state.trace); p.set("step", state.step); }
    const hash = p.toString();
    if (("#" + hash) !== location.hash && !(hash === "" && location.hash === "")) {
      history.replaceState(null, "", hash ? "#" + hash : location.pathname + location.search);
    }
  }
  /* The view a fragment names; what it names that this page lacks is ignored. */
  function readState() {
    const p = new URLSearchParams(location.hash.slice(1));
    const task = data.tasks.indexOf(p.get("task"));
    state.task = task < 0 ? 0 : task;
    const [key, dir] = (p.get("sort") || "").split(":");
    const keys = ["config", ...data.columns.map((c) => c.key)];
    state.sort = keys.includes(key) && (dir === "ascending" || dir === "descending") ? { key, dir } : null;
    state.speed = p.get("speed") === "wall" ? "wall" : "nfe";
    state.filter = p.get("filter") || "all";
    if (filterOf(state.filter) === FILTERS.all) state.filter = "all";
    const names = data.configs.map((c) => c.name);
    state.hidden = new Set((p.get("hide") || "").split("|").map((n) => names.indexOf(n)).filter((i) => i >= 0));
    state.page = Math.max(0, (parseInt(p.get("page"), 10) || 1) - 1);
    state.example = p.get("example");
    state.trace = p.get("trace");
    state.step = parseInt(p.get("step"), 10) || 0;
  }
  /* Open the example (and timeline step) the state names: on its page of the list, scrolled into view. */
  function openFromState() {
    if (state.example === null) return;
    const { example, trace, step } = state;
    const list = (data.examples[taskName()] || []).filter(filterOf(state.filter)[1]);
    const at = list.findIndex((ex) => ex.id === example);
    if (at < 0) { state.example = null; state.trace = null; saveState(); return; }
    if (Math.floor(at / data.per_page) !== state.page) { state.page = Math.floor(at / data.per_page); renderExamples(); }
    const node = [...document.querySelectorAll("#example-list .example")].find((n) => n.dataset.id === example);
    node.open();
    state.example = example;
    state.trace = trace && node.querySelector(".detail").openTimeline(trace, step) ? trace : null;
    node.scrollIntoView();
    saveState();
  }
  function renderTask() {
    for (const tab of document.querySelectorAll("#tasks button")) {
      const selected = tab.dataset.task === taskName();
      tab.setAttribute("aria-selected", String(selected));
      tab.tabIndex = selected ? 0 : -1;
    }
    document.getElementById("task-panel").setAttribute("aria-labelledby", "tab-" + state.task);
    renderBoard();
    renderPlot();
    renderExamples();
  }
  for (const button of document.querySelectorAll("#plot .switch button")) {
    button.addEventListener("click", () => { state.speed = button.dataset.speed; renderPlot(); saveState(); });
  }
  // what scrolls into view lands below the sticky tab bar, however many lines its tabs take
  const padTop = () => { document.documentElement.style.scrollPaddingTop = document.getElementById("tasks").offsetHeight + 8 + "px"; };
  let drawnWidth = document.getElementById("plot-area").clientWidth, resizing = null;
  window.addEventListener("resize", () => {  // redraw the plot at its new width (once the resizing settles)
    clearTimeout(resizing);
    resizing = setTimeout(() => {
      padTop();
      const width = document.getElementById("plot-area").clientWidth;
      if (width !== drawnWidth) { drawnWidth = width; renderPlot(); }
    }, 120);
  });
  renderHeader();
  renderSummary();
  renderTabs();
  readState();
  renderTask();
  padTop();
  openFromState();
  window.addEventListener("hashchange", () => { readState(); renderTask(); openFromState(); });  // a link followed on the page
  window.sbdReport = { ready: true, loadMs: performance.now(), diff };
  document.body.dataset.ready = "true";
})();
