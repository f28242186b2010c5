/* fvlib-live.js: the explorers of the static book, live without a kernel.
 *
 * Written for this book (no library, nothing loaded from outside the site). Each explorer's
 * HTML view (fvlib.explorers.base, fvlib.explorers.live) holds its states
 * (fvlib.explorers.states) on a grid of control values as
 * <script type="application/json" class="fvlib-live-data">, computed by fvlib when the page was
 * built. This module builds the controls (range sliders over the grid values, or selects),
 * and on every change looks up the state of the settings and draws it as SVG with the draw
 * function registered for the explorer's kind. The PNG of the default settings stays in the
 * page for readers without JavaScript and for print (see fvlib-live.css).
 *
 * Adding an explorer: FvlibLive.register(kind, draw), where draw(ctx) draws into ctx.figure
 * (ctx.panel(...) makes one SVG panel) from ctx.state (the embedded state; null when the grid
 * has none at these settings), ctx.view (the values of the view controls) and ctx.shared, and
 * returns the caption. Mark drawn numbers with data-values (ctx.mark) for the browser test.
 */
(function () {
  "use strict";
  const SVG = "http://www.w3.org/2000/svg";
  const draws = {};

  function el(tag, attrs, parent, text) {
    const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== undefined && v !== null) node.setAttribute(k, v);
    }
    if (text !== undefined) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }

  function fmt(v, digits) {
    if (v === null || v === undefined || !isFinite(v)) return "n/a";
    const d = digits === undefined ? 3 : digits;
    if (v === 0) return "0";
    const a = Math.abs(v);
    if (a >= 1e4 || a < 1e-3) return v.toExponential(Math.max(d - 1, 0)).replace("e", "e");
    return Number(v.toPrecision(d)).toString();
  }

  function fixed(v, n) {
    return v === null || v === undefined || !isFinite(v) ? "n/a" : v.toFixed(n);
  }

  // ---- scales and ticks ---------------------------------------------------------------
  function scale(domain, range, log) {
    let [d0, d1] = domain;
    if (log) { d0 = Math.log10(d0); d1 = Math.log10(d1); }
    if (d1 === d0) { d1 = d0 + 1; }
    const f = (v) => {
      const t = ((log ? Math.log10(Math.max(v, 1e-300)) : v) - d0) / (d1 - d0);
      return range[0] + t * (range[1] - range[0]);
    };
    f.log = log;
    f.domain = domain;
    return f;
  }

  function niceTicks(lo, hi, count) {
    const span = hi - lo;
    if (!(span > 0)) return [lo];
    const raw = span / Math.max(count, 1);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
    const ticks = [];
    for (let v = Math.ceil(lo / step - 1e-9) * step; v <= hi + 1e-9 * step; v += step) ticks.push(Number(v.toPrecision(10)));
    return ticks;
  }

  function logTicks(lo, hi) {
    const a = Math.floor(Math.log10(lo)), b = Math.ceil(Math.log10(hi));
    let ticks = [];
    for (let e = a; e <= b; e++) ticks.push(Math.pow(10, e));
    ticks = ticks.filter((t) => t >= lo * 0.999 && t <= hi * 1.001);
    if (ticks.length < 3) {
      const more = [];
      for (let e = a; e <= b; e++) [1, 2, 5].forEach((m) => more.push(m * Math.pow(10, e)));
      ticks = more.filter((t) => t >= lo * 0.999 && t <= hi * 1.001);
    }
    return ticks;
  }

  function logRange(values, pad) {
    const good = values.filter((v) => v !== null && isFinite(v) && v > 0);
    if (!good.length) return [1e-3, 1];
    let lo = Math.min(...good), hi = Math.max(...good);
    const p = pad === undefined ? 1.25 : pad;
    lo /= p; hi *= p;
    if (hi / lo < 10) { const mid = Math.sqrt(hi * lo); lo = mid / Math.sqrt(10); hi = mid * Math.sqrt(10); }
    return [lo, hi];
  }

  // ---- a panel: one SVG with axes -------------------------------------------------------
  function Panel(figure, opts, hint) {
    const box = el("div", {class: "fvlib-live-panel" + (opts.wide ? " fvlib-live-wide" : "")}, figure);
    this.box = box;
    // the width of this panel's box once all panels are laid out (second pass), else its own
    const width = Math.max(Math.floor(hint || box.clientWidth || 320), 200);
    const height = opts.height || Math.round(Math.min(300, Math.max(220, width * 0.62)));
    const m = Object.assign({left: opts.noAxes ? 8 : 58, right: opts.noAxes ? 12 : 20, top: opts.title ? 30 : 10, bottom: opts.noAxes ? 8 : 44},
                            opts.margin || {});
    this.width = width; this.height = height; this.m = m;
    this.svg = el("svg:svg", {width: width, height: height, viewBox: `0 0 ${width} ${height}`,
                              role: "img", "aria-label": opts.title || "figure", class: "fvlib-live-svg"}, box);
    if (opts.title) this.title(opts.title);
    if (opts.noAxes) return;
    this.x = scale(opts.x.domain, [m.left, width - m.right], opts.x.log);
    this.y = scale(opts.y.domain, [height - m.bottom, m.top], opts.y.log);
    this.axes(opts);
  }

  Panel.prototype.title = function (text) {
    // wrap a long title onto two lines at the panel's width
    const maxChars = Math.max(20, Math.floor((this.width - 8) / 7.8));  // bold 12.5 px
    const words = text.split(" ");
    const lines = [""];
    for (const w of words) {
      const cur = lines[lines.length - 1];
      if ((cur + " " + w).trim().length > maxChars && cur) lines.push(w); else lines[lines.length - 1] = (cur + " " + w).trim();
    }
    if (lines.length > 1) {
      this.m.top += 14 * (lines.length - 1);
    }
    lines.forEach((line, i) => el("svg:text", {x: this.width / 2, y: 16 + 14 * i, "text-anchor": "middle",
                                               class: "fvlib-live-title"}, this.svg, line));
  };

  Panel.prototype.axes = function (opts) {
    const {m, width, height} = this;
    const g = el("svg:g", {class: "fvlib-live-axes"}, this.svg);
    const xt = opts.x.ticks || (opts.x.log ? logTicks(...opts.x.domain) : niceTicks(...opts.x.domain, Math.max(2, Math.floor(width / 70))));
    const yt = opts.y.ticks || (opts.y.log ? logTicks(...opts.y.domain) : niceTicks(...opts.y.domain, 5));
    const xlab = opts.x.format || fmt, ylab = opts.y.format || fmt;
    for (const t of yt) {
      const y = this.y(t);
      el("svg:line", {x1: m.left, x2: width - m.right, y1: y, y2: y, class: "fvlib-live-grid"}, g);
      el("svg:text", {x: m.left - 5, y: y + 4, "text-anchor": "end", class: "fvlib-live-tick"}, g, ylab(t));
    }
    for (const t of xt) {
      const x = this.x(t);
      el("svg:line", {x1: x, x2: x, y1: height - m.bottom, y2: height - m.bottom + 4, class: "fvlib-live-frame"}, g);
      el("svg:text", {x: x, y: height - m.bottom + 16, "text-anchor": "middle", class: "fvlib-live-tick"}, g,
         typeof opts.x.labels === "function" ? opts.x.labels(t) : xlab(t));
    }
    el("svg:rect", {x: m.left, y: m.top, width: width - m.left - m.right, height: height - m.top - m.bottom,
                    class: "fvlib-live-box"}, g);
    if (opts.x.label) {
      // squeeze a label that would be wider than the panel (about 6.4 px a character at 12 px)
      const room = width - 8, need = opts.x.label.length * 6.4;
      el("svg:text", {x: need > room ? width / 2 : (m.left + width - m.right) / 2, y: height - 8, "text-anchor": "middle",
                      class: "fvlib-live-label",
                      textLength: need > room ? room : undefined, lengthAdjust: need > room ? "spacingAndGlyphs" : undefined,
                      }, g, opts.x.label);
    }
    if (opts.y.label) el("svg:text", {x: 0, y: 0, transform: `translate(13 ${(m.top + height - m.bottom) / 2}) rotate(-90)`,
                                      "text-anchor": "middle", class: "fvlib-live-label"}, g, opts.y.label);
  };

  function clipY(p, v) {
    const [lo, hi] = p.y.domain;
    return Math.min(Math.max(v, lo), hi);
  }

  Panel.prototype.line = function (xs, ys, o) {
    o = o || {};
    const pts = xs.map((x, i) => [x, ys[i]]).filter((q) => q[1] !== null && isFinite(q[1]) && (!this.y.log || q[1] > 0));
    const d = pts.map((q, i) => `${i ? "L" : "M"}${this.x(q[0]).toFixed(1)},${this.y(clipY(this, q[1])).toFixed(1)}`).join("");
    const path = el("svg:path", {d: d || "M0,0", fill: "none", stroke: o.color || "currentColor", "stroke-width": o.width || 2,
                                 "stroke-dasharray": o.dash}, this.svg);
    if (o.series) { path.setAttribute("data-series", o.series); path.setAttribute("data-values", ys.join(",")); }
    if (o.marker) {
      for (const q of pts) el("svg:circle", {cx: this.x(q[0]), cy: this.y(clipY(this, q[1])), r: o.marker, fill: o.color || "currentColor"}, this.svg);
    }
    return path;
  };

  Panel.prototype.band = function (xs, lo, hi, o) {
    o = o || {};
    const floor = this.y.log ? this.y.domain[0] : -Infinity;
    const top = xs.map((x, i) => `${this.x(x).toFixed(1)},${this.y(clipY(this, hi[i])).toFixed(1)}`);
    const bottom = xs.map((x, i) => `${this.x(x).toFixed(1)},${this.y(clipY(this, Math.max(lo[i], floor))).toFixed(1)}`).reverse();
    if (!xs.length) return null;
    return el("svg:polygon", {points: top.concat(bottom).join(" "), fill: o.color || "#888", opacity: o.opacity || 0.2}, this.svg);
  };

  Panel.prototype.errorbars = function (xs, lo, hi, o) {
    o = o || {};
    const floor = this.y.log ? this.y.domain[0] : -Infinity;
    xs.forEach((x, i) => {
      const X = this.x(x);
      el("svg:line", {x1: X, x2: X, y1: this.y(clipY(this, Math.max(lo[i], floor))), y2: this.y(clipY(this, hi[i])),
                      stroke: o.color || "currentColor", "stroke-width": 1.2}, this.svg);
    });
  };

  Panel.prototype.hline = function (v, o) {
    o = o || {};
    const y = this.y(clipY(this, v));
    return el("svg:line", {x1: this.m.left, x2: this.width - this.m.right, y1: y, y2: y, stroke: o.color || "currentColor",
                           "stroke-width": o.width || 1.2, "stroke-dasharray": o.dash}, this.svg);
  };

  Panel.prototype.vline = function (v, o) {
    o = o || {};
    const x = this.x(v);
    return el("svg:line", {x1: x, x2: x, y1: this.m.top, y2: this.height - this.m.bottom, stroke: o.color || "currentColor",
                           "stroke-width": o.width || 1.2, "stroke-dasharray": o.dash}, this.svg);
  };

  Panel.prototype.span = function (x0, x1, o) {
    const a = this.x(x0), b = this.x(x1);
    return el("svg:rect", {x: Math.min(a, b), y: this.m.top, width: Math.abs(b - a), height: this.height - this.m.top - this.m.bottom,
                           fill: (o && o.color) || "#ebebeb"}, this.svg);
  };

  Panel.prototype.bars = function (xs, ys, o) {
    o = o || {};
    const w = Math.abs(this.x(1) - this.x(0)) * (o.width || 0.4);
    const y0 = this.y(0);
    const g = el("svg:g", {}, this.svg);
    if (o.series) { g.setAttribute("data-series", o.series); g.setAttribute("data-values", ys.join(",")); }
    xs.forEach((x, i) => {
      const y = this.y(clipY(this, ys[i]));
      el("svg:rect", {x: this.x(x + (o.offset || 0)) - w / 2, y: Math.min(y, y0), width: Math.max(w, 0.6), height: Math.abs(y - y0),
                      fill: o.color || "currentColor"}, g);
    });
    return g;
  };

  Panel.prototype.text = function (x, y, text, o) {
    o = o || {};
    return el("svg:text", {x: x, y: y, "text-anchor": o.anchor || "middle", class: o.cls || "fvlib-live-tick",
                           fill: o.color}, this.svg, text);
  };

  function legend(panel, items) {
    const box = el("div", {class: "fvlib-live-legend"}, panel.box);
    for (const it of items) {
      const item = el("span", {class: "fvlib-live-legend-item"}, box);
      const sw = el("span", {class: "fvlib-live-swatch" + (it.dash ? " fvlib-live-swatch-dash" : "")}, item);
      sw.style.setProperty("--swatch", it.color);
      item.appendChild(document.createTextNode(it.label));
    }
    return box;
  }

  // cividis, as matplotlib's heatmaps of the book
  const CIVIDIS = ["#00204d", "#31446b", "#666970", "#958f78", "#cbba69", "#ffea46"];
  function cividis(t) {
    t = Math.min(Math.max(t, 0), 1) * (CIVIDIS.length - 1);
    const i = Math.min(Math.floor(t), CIVIDIS.length - 2), f = t - i;
    const a = CIVIDIS[i], b = CIVIDIS[i + 1];
    const c = [1, 3, 5].map((k) => Math.round(parseInt(a.substr(k, 2), 16) * (1 - f) + parseInt(b.substr(k, 2), 16) * f));
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }

  // ---- one explorer -----------------------------------------------------------------------
  function Explorer(root, data) {
    this.root = root;
    this.data = data;
    this.live = root.querySelector(".fvlib-live");
    this.inputs = {};
    this.outputs = {};
    const form = el("div", {class: "fvlib-live-controls"}, this.live);
    data.controls.forEach((c) => {
      const id = `fvlib-${data.kind}-${c.name}-${Math.random().toString(36).slice(2, 8)}`;
      const wrap = el("div", {class: "fvlib-live-control"}, form);
      el("label", {for: id}, wrap, c.label);
      let input;
      if (c.select) {
        input = el("select", {id: id, name: c.name, "data-control": c.name}, wrap);
        c.values.forEach((v, i) => el("option", {value: i}, input, String(v)));
        input.value = String(c.default);
      } else {
        input = el("input", {id: id, type: "range", min: 0, max: c.values.length - 1, step: 1, value: c.default,
                             name: c.name, "data-control": c.name}, wrap);
        const out = el("output", {for: id}, wrap, String(c.values[c.default]));
        input.addEventListener("input", () => { out.textContent = String(c.values[Number(input.value)]); });
        this.outputs[c.name] = out;
      }
      input.addEventListener("input", () => { this.clamp(); this.draw(); });
      input.addEventListener("change", () => { this.clamp(); this.draw(); });
      this.inputs[c.name] = input;
    });
    this.figure = el("div", {class: "fvlib-live-figure"}, this.live);
    this.caption = el("p", {class: "fvlib-live-caption"}, this.live);
    el("p", {class: "fvlib-explorer-note"}, this.live).appendChild(el("em", {}, null,
      "Live in this page: " + data.note + " The controls move over that grid; in Jupyter or Colab " +
      "(the Colab button at the top of the page) every setting is open."));
    root.classList.add("fvlib-live-on");
    this.live.hidden = false;
    this.draw();
    let width = this.figure.clientWidth;
    const redraw = () => { if (this.figure.clientWidth !== width) { width = this.figure.clientWidth; this.draw(); } };
    if (window.ResizeObserver) new ResizeObserver(redraw).observe(this.figure);
    else window.addEventListener("resize", redraw);
  }

  // a control with at_most (the layers of a budget) never exceeds the other control's value
  Explorer.prototype.clamp = function () {
    const all = this.values().all;
    this.data.controls.forEach((c) => {
      if (!c.at_most || all[c.name] <= all[c.at_most]) return;
      const i = c.values.reduce((best, v, j) => (v <= all[c.at_most] ? j : best), 0);
      this.inputs[c.name].value = String(i);
      if (this.outputs[c.name]) this.outputs[c.name].textContent = String(c.values[i]);
    });
  };

  Explorer.prototype.values = function () {
    const grid = [], view = {}, all = {};
    this.data.controls.forEach((c) => {
      const i = Number(this.inputs[c.name].value);
      all[c.name] = c.values[i];
      if (c.grid) grid.push(c.keys[i]); else view[c.name] = c.values[i];
    });
    return {key: grid.join("|"), view: view, all: all};
  };

  Explorer.prototype.draw = function () {
    // two passes: the first lays the panels out, the second draws each at its box's width
    this.drawAt(null);
    const boxes = Array.from(this.figure.querySelectorAll(".fvlib-live-panel"));
    const widths = boxes.map((b) => b.clientWidth);
    const drawn = boxes.map((b) => Number((b.querySelector("svg") || {getAttribute: () => 0}).getAttribute("width")));
    if (widths.some((w, i) => Math.abs(w - drawn[i]) > 2)) this.drawAt(widths);
  };

  Explorer.prototype.drawAt = function (widths) {
    const {key, view, all} = this.values();
    let panels = 0;
    const state = Object.prototype.hasOwnProperty.call(this.data.states, key) ? this.data.states[key] : null;
    this.figure.textContent = "";
    const draw = draws[this.data.kind];
    const ctx = {
      state: state, view: view, values: all, shared: this.data.shared, figure: this.figure,
      panel: (opts) => new Panel(this.figure, opts, widths ? widths[panels++] : null),
      legend: legend, fmt: fmt, fixed: fixed, logRange: logRange, cividis: cividis, el: el,
    };
    let caption;
    if (!draw) caption = `No drawing for explorer kind "${this.data.kind}".`;
    else if (state === null) caption = "No state was recorded at these settings when this page was built.";
    else caption = draw(ctx);
    this.caption.textContent = caption || "";
    this.root.setAttribute("data-key", key);
    this.root.setAttribute("data-view", JSON.stringify(view));
    if (widths) return;
    this.root.setAttribute("data-draws", String(Number(this.root.getAttribute("data-draws") || 0) + 1));
  };

  function start() {
    document.querySelectorAll(".fvlib-explorer").forEach((root) => {
      const script = root.querySelector("script.fvlib-live-data");
      if (!script || root.classList.contains("fvlib-live-on")) return;
      new Explorer(root, JSON.parse(script.textContent));
    });
  }

  window.FvlibLive = {register: (kind, fn) => { draws[kind] = fn; }, start: start, fmt: fmt};

  // ---- the book's explorers ------------------------------------------------------------------
  // prior: the tree with the sampled path, and the tree sample beside the Gaussian twin's
  draws.prior = function (ctx) {
    const s = ctx.state, sh = ctx.shared, K = s.depth, D = s.dim;
    const tree = ctx.panel({title: `tree prior, K = ${K}, alpha = ${ctx.fixed(s.alpha, 2)}: one path per context`,
                            noAxes: true, height: 230});
    const top = tree.m.top + 10, bottom = tree.height - 30, left = 14, right = tree.width - 14;
    const pos = (n) => {
      const k = Math.floor(Math.log2(n + 1)), i = n + 1 - Math.pow(2, k);
      return [left + (i + 0.5) / Math.pow(2, k) * (right - left), top + (K > 1 ? k / (K - 1) : 0) * (bottom - top)];
    };
    const onPath = s.theta.map((v) => v !== 0);
    for (let n = 1; n < D; n++) {
      const [x1, y1] = pos(Math.floor((n - 1) / 2)), [x2, y2] = pos(n);
      ctx.el("svg:line", {x1: x1, y1: y1, x2: x2, y2: y2, stroke: onPath[n] ? sh.colors.path : "#bbb",
                          "stroke-width": onPath[n] ? 3 : 1}, tree.svg);
    }
    const r = Math.max(2, Math.min(9, (right - left) / Math.pow(2, K - 1) / 2.6));
    for (let n = 0; n < D; n++) {
      const [x, y] = pos(n);
      ctx.el("svg:circle", {cx: x, cy: y, r: r, fill: onPath[n] ? sh.colors.path : "#fff", stroke: onPath[n] ? sh.colors.path : "#888",
                            "stroke-width": 1}, tree.svg);
    }
    const path = [];
    for (let n = 0; n < D; n++) if (onPath[n]) path.push(n);
    tree.svg.setAttribute("data-series", "path");
    tree.svg.setAttribute("data-values", path.join(","));
    path.forEach((n) => {
      const [x, y] = pos(n);
      if (K > 5) return;
      // a label right of its node fits if the next node of the level is far enough; else (the
      // leaves of deep trees) it goes below the node, where there is room
      const gap = (right - left) / Math.pow(2, Math.floor(Math.log2(n + 1)));
      if (gap >= 2 * r + 38) tree.text(x + r + 3, y + 4, ctx.fmt(s.theta[n], 2), {anchor: "start", color: sh.colors.path});
      else tree.text(x, y + r + 12, ctx.fmt(s.theta[n], 2), {anchor: "middle", color: sh.colors.path, cls: "fvlib-live-tick fvlib-live-halo"});
    });
    const all = s.theta.concat(s.twin_theta).map(Math.abs);
    const lim = Math.max(...all, 0.1) * 1.1;
    const bars = ctx.panel({title: "same second moments, different structure", x: {domain: [-0.7, D - 0.3],
                            label: "coordinate n (heap order; grey lines: levels)",
                            ticks: D <= 15 ? [...Array(D).keys()] : niceTicks(0, D - 1, 6).filter((t) => t === Math.round(t))},
                            y: {domain: [-lim, lim], label: "theta_n"}});
    for (let k = 1; k < K; k++) bars.vline(Math.pow(2, k) - 1.5, {color: "#ccc", width: 1});
    bars.hline(0, {width: 0.8});
    const idx = [...Array(D).keys()];
    bars.bars(idx, s.theta, {offset: -0.2, width: 0.4, color: sh.colors.tree, series: "theta"});
    bars.bars(idx, s.twin_theta, {offset: 0.2, width: 0.4, color: sh.colors.twin, series: "twin_theta"});
    ctx.legend(bars, [{color: sh.colors.tree, label: "tree sample theta"}, {color: sh.colors.twin, label: "Gaussian twin sample"}]);
    return `D = ${D} coordinates, E|theta|^2 = ${ctx.fixed(s.energy, 3)} for both priors. The tree sample has one ` +
      `non-zero coordinate per level (${s.nonzero} of ${D}); the twin spreads the same energy over all of them. ` +
      `Sample seed ${ctx.values.seed}.`;
  };

  // strategy: Monte Carlo excess losses of three strategies against the budget
  draws.strategy = function (ctx) {
    const s = ctx.state, sh = ctx.shared, M = Math.min(ctx.view.budget, s.budgets.length);
    const budgets = s.budgets.slice(0, M);
    const names = sh.strategies;
    const lo = {}, hi = {};
    let ys = [];
    for (const n of names) {
      lo[n] = s.mean[n].slice(0, M).map((v, i) => v - 2 * s.stderr[n][i]);
      hi[n] = s.mean[n].slice(0, M).map((v, i) => v + 2 * s.stderr[n][i]);
      ys = ys.concat(s.mean[n].slice(0, M), hi[n]);
    }
    const p = ctx.panel({wide: true, title: `K = ${sh.depth}, alpha = ${ctx.fixed(ctx.values.alpha, 2)}, N = ${ctx.values.n_ctx}, ` +
                         `sigma = ${ctx.fixed(ctx.values.noise_std, 2)} (tau^2 = ${ctx.fmt(s.tau2)}); error bars 2 s.e.`,
                         x: {domain: [0.5, Math.max(M, 1) + 0.5], ticks: budgets.filter((b) => M <= 12 || b % 2 === 1),
                             label: "budget M (= layers L for the adaptive strategy)"},
                         y: {domain: ctx.logRange(ys.concat(lo[names[0]])), log: true, label: "excess loss"}});
    for (const n of names) {
      p.errorbars(budgets, lo[n], hi[n], {color: sh.colors[n]});
      p.line(budgets, s.mean[n].slice(0, M), {color: sh.colors[n], marker: 3.5, series: n});
    }
    ctx.legend(p, names.map((n) => ({color: sh.colors[n], label: sh.labels[n]})));
    const f = (n) => ctx.fixed(s.mean[n][M - 1], 4);
    return `At M = ${M}: adaptive ${f(names[0])}, non-adaptive ${f(names[1])}, LMMSE ${f(names[2])}. ` +
      `${s.samples} Monte Carlo contexts per point (seed ${sh.seed}, the same contexts at every budget).`;
  };

  // training: a recorded run played back up to the chosen step, against its theory baseline
  draws.training = function (ctx) {
    const s = ctx.state, sh = ctx.shared, color = sh.colors[s.model];
    const upto = s.steps.filter((t) => t <= ctx.view.step).length;
    const steps = s.steps.slice(0, upto), loss = s.loss.slice(0, upto), se = s.stderr.slice(0, upto);
    const all = s.loss.concat([s.theory]).concat(s.loss.map((v, i) => v + 2 * s.stderr[i]));
    const done = upto ? steps[upto - 1] : 0;
    const status = done >= s.total_steps ? "finished" : `step ${done} of ${s.total_steps}`;
    const p = ctx.panel({wide: true, title: `model ${s.model}, ${s.prior} prior, K = ${sh.depth}, M = ${sh.budget}: ${status}`,
                         x: {domain: [0, s.total_steps], label: "training step"},
                         y: {domain: ctx.logRange(all), log: true, label: "excess loss"}});
    p.band(steps, loss.map((v, i) => v - 2 * se[i]), loss.map((v, i) => v + 2 * se[i]), {color: color, opacity: 0.22});
    p.line(steps, loss, {color: color, marker: 2.5, series: "loss"});
    p.hline(s.theory, {dash: "6 4", width: 1.4}).setAttribute("data-values", String(s.theory));
    p.vline(ctx.view.step, {color: "#999", width: 1, dash: "2 3"});
    ctx.legend(p, [{color: color, label: `model ${s.model} (evaluation set, band 2 s.e.)`},
                   {color: "currentColor", dash: true, label: s.theory_label}]);
    const baseline = `Theory baseline: ${s.theory_label} = ${ctx.fixed(s.theory, 4)}` +
      (s.theory_samples ? ` (Monte Carlo, ${s.theory_samples} contexts).` : " (exact).");
    if (!upto) return `${baseline} Step 0 not recorded.`;
    return `${baseline} Step ${done}: excess loss ${ctx.fixed(loss[upto - 1], 4)} on ${s.eval_contexts} held-out contexts.`;
  };

  // patching: the heatmap with the cell outlined, its row, and the patch level by level
  draws.patching = function (ctx) {
    const s = ctx.state, sh = ctx.shared, K = sh.depth, L = sh.n_layers, m = s.split_level, l = s.layer;
    const mainName = sh.ratio.model ? "model" : "theory";
    const ratio = sh.ratio[mainName];
    const vmin = 0.5, vmax = Math.max(2, ...ratio.flat());
    const hm = ctx.panel({title: `${sh.source}: loss ratio, patched / unpatched`, height: 250,
                          x: {domain: [0.5, L + 0.5], ticks: [...Array(L).keys()].map((i) => i + 1), label: "patched layer l"},
                          y: {domain: [K + 0.5, 0.5], ticks: [...Array(K).keys()].map((i) => i + 1), label: "split level m"},
                          margin: {left: 46}});
    const cw = Math.abs(hm.x(1) - hm.x(0)), ch = Math.abs(hm.y(1) - hm.y(0));
    const t = (v) => Math.log(Math.min(Math.max(v, vmin), vmax) / vmin) / Math.log(vmax / vmin);
    for (let i = 0; i < K; i++) {
      for (let j = 0; j < L; j++) {
        const v = ratio[i][j];
        ctx.el("svg:rect", {x: hm.x(j + 0.5), y: hm.y(i + 0.5), width: cw, height: ch, fill: ctx.cividis(t(v))}, hm.svg);
        if (cw > 22) hm.text(hm.x(j + 1), hm.y(i + 1) + 4, v < 100 ? v.toFixed(1) : v.toFixed(0),
                             {color: t(v) < 0.55 ? "#fff" : "#000"});
      }
    }
    let stair = "";
    for (let i = 0; i < K; i++) {
      const x = hm.x(Math.min(i + 1, L) + 0.5);
      stair += `${i ? "L" : "M"}${x},${hm.y(i + 0.5)}L${x},${hm.y(i + 1.5)}`;
    }
    ctx.el("svg:path", {d: stair, stroke: sh.colors.split, "stroke-width": 2.5, fill: "none"}, hm.svg);
    // a white halo under the outline keeps it visible on the dark cells too
    ctx.el("svg:rect", {x: hm.x(l - 0.5) + 2, y: hm.y(m - 0.5) + 2, width: cw - 4, height: ch - 4, fill: "none",
                        stroke: "#fff", "stroke-width": 6}, hm.svg);
    const cell = ctx.el("svg:rect", {x: hm.x(l - 0.5) + 2, y: hm.y(m - 0.5) + 2, width: cw - 4, height: ch - 4, fill: "none",
                                     stroke: sh.colors.cell, "stroke-width": 3}, hm.svg);
    cell.setAttribute("data-series", "cell");
    cell.setAttribute("data-values", `${m},${l},${ratio[m - 1][l - 1]}`);
    ctx.legend(hm, [{color: sh.colors.split, label: "l = m (right of it: patched after the split)"},
                    {color: sh.colors.cell, label: `cell (m = ${m}, l = ${l})`}]);

    const layers = [...Array(L).keys()].map((i) => i + 1);
    const rows = Object.keys(sh.ratio).map((name) => [name, sh.ratio[name][m - 1]]);
    const row = ctx.panel({title: `row m = ${m} of the heatmap`, height: 250,
                           x: {domain: [0.5, L + 0.5], ticks: layers, label: "patched layer l (shaded: l > m)"},
                           y: {domain: ctx.logRange(rows.flatMap((r) => r[1]), 1.3), log: true, label: "patched / unpatched loss"}});
    if (m < L) row.span(m + 0.5, L + 0.5);
    row.vline(l, {color: sh.colors.cell, width: 1.5});
    const style = {model: [sh.colors.model, undefined, "trained model"], theory: ["currentColor", "6 4", "greedy theory"]};
    rows.forEach(([name, values]) => row.line(layers, values, {color: style[name][0], dash: style[name][1], marker: 3.5,
                                                               series: `row-${name}`}));
    ctx.legend(row, rows.map(([name]) => ({color: style[name][0], dash: !!style[name][1], label: style[name][2]})));

    const levels = [...Array(K).keys()];
    const lv = ctx.panel({title: `patch (m = ${m}, l = ${l}), level by level`, height: 250,
                          x: {domain: [-0.6, K - 0.4], ticks: levels, label: "tree level k"},
                          y: {domain: [-1.15, 1.15], ticks: [-1, -0.5, 0, 0.5, 1], label: "overlap of the prediction"}});
    lv.hline(0, {width: 0.8});
    lv.bars(levels, s.target_overlap, {offset: -0.2, width: 0.38, color: sh.colors.target, series: "target_overlap"});
    lv.bars(levels, s.donor_overlap, {offset: 0.2, width: 0.38, color: sh.colors.donor, series: "donor_overlap"});
    const bw = Math.abs(lv.x(1) - lv.x(0)) * 0.45;
    levels.forEach((k) => {
      const y = lv.y(s.baseline_overlap[k]);
      ctx.el("svg:line", {x1: lv.x(k) - bw, x2: lv.x(k) + bw, y1: y, y2: y, stroke: "currentColor", "stroke-width": 2.5}, lv.svg);
    });
    ctx.legend(lv, [{color: sh.colors.target, label: "target's path"}, {color: sh.colors.donor, label: "donor's path"},
                    {color: "currentColor", label: "unpatched (target)"}]);
    return `${sh.source}: patching layer ${l} with donors that split at level ${m} multiplies the loss by ` +
      `${ctx.fixed(s.ratio, 2)}. ${sh.contexts} donor/target pairs per cell (seed ${sh.seed}).`;
  };

  // dp_policy: the optimal two-layer policy as a decision tree, and the three policies' risks
  draws.dp_policy = function (ctx) {
    const s = ctx.state, sh = ctx.shared, b = s.branches, n = b.node.length;
    const level = (node) => Math.floor(Math.log2(node + 1));
    const tree = ctx.panel({wide: true, title: `optimal policy at tau = ${ctx.fmt(s.tau)}, L = ${s.layers} ` +
                            `(K = ${s.depth}, alpha = ${ctx.fmt(s.alpha)}): first measurement, then one per interval of phi_1`,
                            noAxes: true, height: 210});
    const W = tree.width, top = tree.m.top + 22, bottom = tree.height - 44;
    const box = (x, y, lines, color) => {
      const w = Math.min(150, Math.max(84, (W - 20) / Math.max(n, 1) - 8)), h = 16 * lines.length + 6;
      ctx.el("svg:rect", {x: x - w / 2, y: y - h / 2, width: w, height: h, rx: 5, fill: "#fff", stroke: color,
                          "stroke-width": 1.8}, tree.svg);
      lines.forEach((t, i) => tree.text(x, y - h / 2 + 16 * (i + 1) - 2, t, {color: "#000"}));
    };
    const xs = b.node.map((_, i) => 10 + (i + 0.5) * (W - 20) / n);
    b.node.forEach((node, i) => {
      ctx.el("svg:line", {x1: W / 2, y1: top + 12, x2: xs[i], y2: bottom - 20, stroke: "#888", "stroke-width": 1.2}, tree.svg);
      const lo = b.lo[i] === null ? "-inf" : ctx.fixed(b.lo[i], 2), hi = b.hi[i] === null ? "inf" : ctx.fixed(b.hi[i], 2);
      tree.text((W / 2 + xs[i]) / 2 + (xs[i] < W / 2 ? -6 : xs[i] > W / 2 ? 6 : 0), (top + bottom) / 2,
                `phi_1 in (${lo}, ${hi})`, {anchor: xs[i] < W / 2 - 1 ? "end" : xs[i] > W / 2 + 1 ? "start" : "middle"});
    });
    box(W / 2, top, [`node ${s.first_node} (level ${level(s.first_node)})`], sh.colors.optimal);
    b.node.forEach((node, i) => box(xs[i], bottom, [`node ${node} (level ${level(node)})`, `P = ${ctx.fixed(b.prob[i], 3)}`],
                                    node === s.first_node ? sh.colors.greedy : "#666"));
    tree.svg.setAttribute("data-series", "prob");
    tree.svg.setAttribute("data-values", b.prob.join(","));
    const names = ["optimal", "greedy", "nonadaptive"], vals = names.map((k) => s.values[k]);
    const bars = ctx.panel({title: `expected final risk (optimal / greedy = ${ctx.fixed(s.ratio, 3)})`, height: 240,
                            x: {domain: [-0.6, 2.6], ticks: [0, 1, 2], labels: (t) => ["optimal", "greedy", "non-adaptive"][t]},
                            y: {domain: [0, 1.15 * Math.max(...vals)], label: "risk"}});
    names.forEach((k, i) => bars.bars([i], [vals[i]], {width: 0.6, color: sh.colors[k]}));
    const g = bars.svg.lastChild;
    g.setAttribute("data-series", "values");
    g.setAttribute("data-values", vals.join(","));
    names.forEach((k, i) => bars.text(bars.x(i), bars.y(vals[i]) - 4, ctx.fixed(vals[i], 3)));
    return `tau = ${ctx.fmt(s.tau)}: optimal ${ctx.fixed(vals[0], 4)}, greedy ${ctx.fixed(vals[1], 4)}, non-adaptive ` +
      `${ctx.fixed(vals[2], 4)}. The optimal policy measures node ${s.first_node} first and measures it again with ` +
      `probability ${ctx.fixed(s.remeasure_prob, 3)}. Exact quadrature (${s.quad_points}-point ${s.rule} rule), no Monte Carlo.`;
  };

  // layer_split: M measurements in L layers, tree against the Gaussian twin (closed forms)
  draws.layer_split = function (ctx) {
    const s = ctx.state, c = ctx.shared.colors, L = s.layers, M = s.budget;
    const top = 1.05 * Math.max(...s.gaussian_by_budget, ...s.tree_by_budget, ...s.tree_by_layers);
    const y = {domain: [-0.02 * top, top], label: "excess loss (no noise)"};
    // the same axes at every setting: 1 to the largest budget (L <= M, so each curve covers part)
    const last = s.budget_axis[s.budget_axis.length - 1], ticks = [...Array(last).keys()].map((i) => i + 1);
    const a = ctx.panel({title: `budget M = ${M} split evenly over L layers`, height: 250,
                         x: {domain: [0.5, last + 0.5], ticks: ticks, label: "layers L"}, y: y});
    a.line(s.layer_axis, s.layer_axis.map(() => s.gaussian_loss), {color: c.gaussian, dash: "6 4", marker: 2.5, series: "gaussian_by_layers"});
    a.line(s.layer_axis, s.tree_by_layers, {color: c.tree, marker: 3, series: "tree_by_layers"});
    ctx.el("svg:circle", {cx: a.x(L), cy: a.y(s.tree_loss), r: 8, fill: "none", stroke: c.mark, "stroke-width": 1.5,
                          "data-series": "selection", "data-values": `${M},${L}`}, a.svg);
    ctx.legend(a, [{color: c.tree, label: "tree (adaptive)"}, {color: c.gaussian, dash: true, label: "Gaussian twin"},
                   {color: c.mark, label: `L = ${L}`}]);
    const b = ctx.panel({title: `loss against the budget at L = ${L}`, height: 250,
                         x: {domain: [0.5, last + 0.5], ticks: ticks, label: "budget M"}, y: y});
    b.line(s.budget_axis, s.gaussian_by_budget, {color: c.gaussian, dash: "6 4", marker: 2.5, series: "gaussian_by_budget"});
    b.line(s.budget_axis, s.tree_by_budget, {color: c.tree, marker: 3, series: "tree_by_budget"});
    ctx.el("svg:circle", {cx: b.x(M), cy: b.y(s.tree_loss), r: 8, fill: "none", stroke: c.mark, "stroke-width": 1.5}, b.svg);
    ctx.legend(b, [{color: c.tree, label: `tree, L = ${L}`}, {color: c.gaussian, dash: true, label: "Gaussian twin, any L"}]);
    return `M = ${M} measurements in L = ${L} layers (sizes ${s.layer_sizes.join(", ")}): tree ${ctx.fixed(s.tree_loss, 4)}, ` +
      `Gaussian twin ${ctx.fixed(s.gaussian_loss, 4)} (the same for every L). K = ${s.depth}, alpha = ${ctx.fmt(s.alpha)}, ` +
      `no channel noise; closed forms, no Monte Carlo.`;
  };

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
