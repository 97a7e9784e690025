/* selbench leaderboard.html: tables, filters, sorting, curves and the summary across
   experiments, drawn from the inline JSON (#lb-data). The view lives in the URL fragment:
   #sort=<metric|method>&dir=asc|desc&filter=<text>&scheme=&selector=&recalibrator=
   &method=<label>&beta=<β>&iv=1 */
runPage(function (D) {
  var F = {};
  D.fields.forEach(function (f, i) { F[f] = i; });
  var PARTS = ["scheme", "selector", "recalibrator"];
  var state = {};
  var tables = [];   // {exp, tbody, heads: {key: th}, rows: [{row, tr, index}], chart}
  var summaryRows = [];

  function readHash() {
    var q = new URLSearchParams(location.hash.replace(/^#/, ""));
    state = {sort: q.get("sort") || "", dir: q.get("dir") === "asc" || q.get("dir") === "desc" ? q.get("dir") : "",
             filter: q.get("filter") || "", method: q.get("method") || "", beta: q.get("beta") || "",
             iv: q.get("iv") === "1"};
    PARTS.forEach(function (p) { state[p] = q.get(p) || ""; });
    if (state.sort && !state.dir) state.dir = defaultDir(state.sort);
  }

  function writeHash() {
    var q = new URLSearchParams();
    ["sort", "dir", "filter"].concat(PARTS, ["method", "beta"]).forEach(function (k) { if (state[k]) q.set(k, state[k]); });
    if (state.iv) q.set("iv", "1");
    var hash = q.toString();
    if (hash !== location.hash.replace(/^#/, "")) {
      try { history.replaceState(null, "", hash ? "#" + hash : location.pathname + location.search); }
      catch (e) { location.hash = hash; }
    }
    document.body.setAttribute("data-view", location.hash.replace(/^#/, ""));  // the URL's view now
  }

  function defaultDir(key) {
    var m = D.metrics[key];
    return m && m.lower === false ? "desc" : "asc";
  }

  function pointOf(exp) {
    if (exp.points.indexOf("auc") >= 0) return "auc";
    if (state.beta && exp.points.indexOf(state.beta) >= 0) return state.beta;
    var tb = String(exp.train_beta);
    return exp.points.indexOf(tb) >= 0 ? tb : exp.points[0];
  }

  function stat(row, key, point) {
    var per = row.cells[key];
    return per && per[point] ? per[point] : null;
  }

  function visible(row) {
    var text = state.filter.toLowerCase();
    var hay = [row.method].concat(PARTS.map(function (p) { return row[p] || ""; }), [row.loss || ""]).join(" ").toLowerCase();
    if (text && hay.indexOf(text) < 0) return false;
    return PARTS.every(function (p) { return !state[p] || row[p] === state[p]; });
  }

  function cellTitle(key, st, level) {
    var m = D.metrics[key] || {label: key};
    if (!st) return m.label + ": no value";
    var lines = [m.label + ": mean " + fmt(st[F.mean], 4) + ", std " + fmt(st[F.std], 4) + " over " + st[F.n] + " seed(s)"];
    if (st[F.ci_low] !== null) lines.push("95% t-interval over seeds: [" + fmt(st[F.ci_low], 4) + ", " + fmt(st[F.ci_high], 4) + "]");
    if (st[F.boot_low] !== null)
      lines.push(Math.round(100 * (level || 0.95)) + "% bootstrap interval over evaluation examples (mean of the seeds' bounds): [" +
        fmt(st[F.boot_low], 4) + ", " + fmt(st[F.boot_high], 4) + "]");
    if (st[F.best_mean]) lines.push("best mean");
    else if (st[F.best]) lines.push("not significantly worse than the best (p = " + fmtP(st[F.p]) + ")");
    else if (st[F.p] !== null) lines.push("p against the best mean: " + fmtP(st[F.p]));
    return lines.join("\n");
  }

  function cell(key, st, level) {
    var text = !st || st[F.mean] === null ? "–" : fmt(st[F.mean]);
    var sd = st && st[F.mean] !== null && st[F.n] > 1 && st[F.std] !== null ? el("span", {class: "sd", text: " ± " + fmt(st[F.std])}) : null;
    var iv = st && st[F.ci_low] !== null ? "[" + fmt(st[F.ci_low]) + ", " + fmt(st[F.ci_high]) + "]" :
      st && st[F.boot_low] !== null ? "[" + fmt(st[F.boot_low]) + ", " + fmt(st[F.boot_high]) + "]" : "";
    return el("td", {class: "num" + (st && st[F.best] ? " best" : ""), "data-metric": key, title: cellTitle(key, st, level)},
      [st && st[F.best] ? el("strong", {}, [text, sd]) : el("span", {}, [text, sd]), iv ? el("span", {class: "iv", text: iv}) : null]);
  }

  function methodCell(row) {
    var parts = PARTS.map(function (p) { return row[p]; }).filter(Boolean);
    var tip = PARTS.map(function (p) { return p + ": " + (row[p] || "–"); }).join("\n") +
      (row.loss ? "\nloss: " + row.loss : "") + "\nseeds: " + row.seeds.join(", ");
    var tuned = row.tuned ? el("span", {class: "badge", title: tunedText(row.tuned), text: "tuned"}) : null;
    var extra = Object.keys(row.extra || {}).length ? el("span", {class: "badge warn", title: JSON.stringify(row.extra, null, 1), text: Object.keys(row.extra).join(", ")}) : null;
    return el("th", {scope: "row", class: "method"}, [
      el("button", {type: "button", class: "linkish", title: tip + "\n(click: this method in every experiment)",
        onclick: function () { select(row.method); }, text: row.method}), " ", tuned, extra,
      el("span", {class: "parts", text: parts.join(" · ")})]);
  }

  function tunedText(tuned) {
    return "chosen parameters by seed:\n" + Object.keys(tuned).map(function (s) {
      return "seed " + s + ": " + Object.keys(tuned[s]).map(function (k) { return k + " = " + fmtNum(tuned[s][k]); }).join(", ");
    }).join("\n");
  }

  function header(key, label, help, t) {
    var th = el("th", {scope: "col", "aria-sort": "none", "data-key": key}, [
      el("button", {type: "button", class: "sort", title: help + "\nPress to sort; again to reverse.", text: label},
        [el("span", {class: "arrow", "aria-hidden": "true"})])]);
    th.firstChild.addEventListener("click", function () {
      if (state.sort === key) state.dir = state.dir === "asc" ? "desc" : "asc";
      else { state.sort = key; state.dir = key === "method" ? "asc" : defaultDir(key); }
      update();
    });
    t.heads[key] = th;
    return th;
  }

  function buildTable(exp, t) {
    var heads = [header("method", "Method", "Method label (sorts alphabetically)", t)];
    exp.metrics.forEach(function (k) {
      var m = D.metrics[k] || {label: k, help: k, lower: null};
      heads.push(header(k, m.label + (m.lower === null ? "" : m.lower ? " ↓" : " ↑"), m.help, t));
    });
    t.tbody = el("tbody");
    var table = el("table", {class: "lb", "data-experiment": exp.name}, [
      el("caption", {class: "sr-only", text: exp.name + ": methods by metric"}), el("thead", {}, [el("tr", {}, heads)]), t.tbody]);
    return el("div", {class: "table-wrap", tabindex: "0", role: "region", "aria-label": exp.name + " table"}, [table]);
  }

  function fillRows(t) {
    var point = pointOf(t.exp);
    t.tbody.textContent = "";
    t.rows = t.exp.rows.map(function (row, i) {
      var tr = el("tr", {"data-method": row.method}, [methodCell(row)].concat(
        t.exp.metrics.map(function (k) { return cell(k, stat(row, k, point), t.exp.level); })));
      t.tbody.appendChild(tr);
      return {row: row, tr: tr, index: i};
    });
    t.point = point;
  }

  function sortKey(t, r) {
    if (state.sort === "method") return r.row.method.toLowerCase();
    var st = stat(r.row, state.sort, t.point);
    return st ? st[F.mean] : null;
  }

  function order(t) {
    var known = state.sort === "method" || t.exp.metrics.indexOf(state.sort) >= 0;
    var rows = t.rows.slice();
    if (known) {
      var sign = state.dir === "desc" ? -1 : 1;
      rows.sort(function (a, b) {
        var x = sortKey(t, a), y = sortKey(t, b);
        if (x === null && y === null) return a.index - b.index;
        if (x === null) return 1;
        if (y === null) return -1;
        return x < y ? -sign : x > y ? sign : a.index - b.index;
      });
    }
    Object.keys(t.heads).forEach(function (k) {
      var on = known && k === state.sort;
      t.heads[k].setAttribute("aria-sort", on ? (state.dir === "asc" ? "ascending" : "descending") : "none");
      t.heads[k].querySelector(".arrow").textContent = on ? (state.dir === "asc" ? " ▲" : " ▼") : "";
    });
    rows.forEach(function (r) {
      t.tbody.appendChild(r.tr);
      r.tr.hidden = !visible(r.row);
      r.tr.classList.toggle("selected", r.row.method === state.method);
    });
  }

  /* ---------------------------------------------------------------- curves over β */
  function chartMetric(exp, sel) {
    var withCurves = exp.metrics.filter(function (k) { return (D.metrics[k] || {}).kind !== "ranking" && exp.rows.some(function (r) { return r.curves[k]; }); });
    if (sel && withCurves.indexOf(sel) >= 0) return sel;
    if (withCurves.indexOf(state.sort) >= 0) return state.sort;
    return withCurves.indexOf("ece1") >= 0 ? "ece1" : withCurves[0];
  }

  function drawChart(t) {
    var exp = t.exp, key = chartMetric(exp, t.chartSelect.value), W = 360, H = 250, L = 50, R = 18, T = 10, B = 36;
    t.chartBox.textContent = "";
    if (!key || exp.betas.length < 2) { t.chartBox.appendChild(el("p", {class: "muted", text: "No curve over β to draw."})); return; }
    t.chartSelect.value = key;
    var shown = exp.rows.map(function (r, i) { return {r: r, i: i}; }).filter(function (o) { return visible(o.r) && o.r.curves[key]; });
    var lo = Infinity, hi = -Infinity;
    shown.forEach(function (o) { o.r.curves[key][0].forEach(function (v, j) {
      if (v === null) return;
      var s = o.r.method === state.method ? (o.r.curves[key][1][j] || 0) : 0;
      lo = Math.min(lo, v - s); hi = Math.max(hi, v + s); }); });
    if (!isFinite(lo)) { t.chartBox.appendChild(el("p", {class: "muted", text: "No method shown."})); return; }
    if (hi - lo < 1e-9) { lo -= 0.01; hi += 0.01; }
    var b0 = Math.min.apply(null, exp.betas), b1 = Math.max.apply(null, exp.betas);
    function x(b) { return L + (b - b0) / (b1 - b0) * (W - L - R); }
    function y(v) { return T + (hi - v) / (hi - lo) * (H - T - B); }
    var g = [sv("rect", {x: L, y: T, width: W - L - R, height: H - T - B, class: "frame"})];
    for (var k = 0; k <= 4; k++) {
      var v = lo + k * (hi - lo) / 4, bv = b0 + k * (b1 - b0) / 4;
      g.push(sv("line", {x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid"}));
      g.push(sv("text", {x: L - 4, y: y(v) + 3, "text-anchor": "end", class: "tick"}, [fmtNum(Number(v.toPrecision(3)))]));
      g.push(sv("text", {x: x(bv), y: H - B + 15, "text-anchor": "middle", class: "tick"}, [fmtNum(Number(bv.toPrecision(3)))]));
    }
    g.push(sv("text", {x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle", class: "axis"}, ["coverage β"]));
    var dashes = ["", "6 3", "2 2", "6 2 2 2"], pal = D.palette;
    shown.forEach(function (o) {
      var c = o.r.curves[key], sel = o.r.method === state.method;
      var pts = exp.betas.map(function (b, j) { return c[0][j] === null ? null : [x(b), y(c[0][j])]; }).filter(Boolean);
      var color = pal[o.i % pal.length], dash = dashes[Math.floor(o.i / pal.length) % dashes.length];
      if (sel && c[1]) {
        var up = exp.betas.map(function (b, j) { return x(b) + "," + y(c[0][j] + (c[1][j] || 0)); });
        var dn = exp.betas.map(function (b, j) { return x(b) + "," + y(c[0][j] - (c[1][j] || 0)); }).reverse();
        g.push(sv("polygon", {points: up.concat(dn).join(" "), fill: color, "fill-opacity": 0.18, stroke: "none"}));
      }
      g.push(sv("polyline", {points: pts.map(function (p) { return p.join(","); }).join(" "), fill: "none", stroke: color,
        "stroke-width": sel ? 3.5 : 1.4, "stroke-dasharray": dash || null, "data-method": o.r.method,
        class: "curve" + (sel ? " selected" : ""), onclick: function () { select(o.r.method); }},
        [sv("title", {}, [o.r.method + ": " + exp.betas.map(function (b, j) { return "β=" + b + " " + fmt(c[0][j]); }).join(", ")])]));
    });
    var m = D.metrics[key] || {label: key};
    t.chartBox.appendChild(sv("svg", {viewBox: "0 0 " + W + " " + H, class: "chart", role: "img",
      "aria-label": m.label + " against coverage β, mean over seeds, one line per method shown"}, g));
    t.chartBox.appendChild(el("ul", {class: "legend"}, shown.map(function (o) {
      return el("li", {}, [el("button", {type: "button", class: "linkish" + (o.r.method === state.method ? " on" : ""),
        onclick: function () { select(o.r.method); }}, [el("span", {class: "swatch", style: "border-color:" + pal[o.i % pal.length] +
        ";border-style:" + (Math.floor(o.i / pal.length) % 4 ? "dashed" : "solid")}), o.r.method])]);
    })));
  }

  function figures(exp) {
    var side = el("aside", {class: "figs", "aria-label": exp.name + " figures"});
    var t = tables[tables.length - 1];
    t.chartSelect = el("select", {"aria-label": "metric of the curve", onchange: function () { drawChart(t); }},
      exp.metrics.filter(function (k) { return (D.metrics[k] || {}).kind !== "ranking"; }).map(function (k) {
        return el("option", {value: k, text: (D.metrics[k] || {label: k}).label}); }));
    t.chartBox = el("div", {class: "chart-box"});
    side.appendChild(el("p", {class: "figtitle"}, ["Over coverage β (mean over seeds): ", t.chartSelect]));
    side.appendChild(t.chartBox);
    if (exp.figures.length) side.appendChild(el("p", {class: "links"}, ["The run's figures: "].concat(
      [].concat.apply([], exp.figures.map(function (f, i) { return [i ? " · " : "", el("a", {href: f[1], text: f[0]})]; })))));
    return side;
  }

  /* ---------------------------------------------------------------- experiments */
  function experiment(exp) {
    var t = {exp: exp, heads: {}, rows: []};
    tables.push(t);
    var sec = el("section", {class: "experiment", id: "exp-" + exp.name, "aria-labelledby": "h-" + exp.name}, [
      el("h2", {id: "h-" + exp.name, text: exp.name})].concat(exp.notes.map(function (n) { return el("p", {class: "note", text: n}); })));
    if (exp.points.indexOf("auc") < 0 && exp.points.length > 1) {
      t.betaSelect = el("select", {"aria-label": "coverage β of the table", onchange: function () {
        state.beta = t.betaSelect.value; update(); }}, exp.points.map(function (p) { return el("option", {value: p, text: "β = " + p}); }));
      sec.appendChild(el("p", {class: "note"}, ["Values at ", t.betaSelect]));
    }
    if (Object.keys(exp.extra).length) sec.appendChild(el("details", {}, [el("summary", {text: "More about this experiment"}), generic(exp.extra)]));
    sec.appendChild(el("div", {class: "exp-grid"}, [buildTable(exp, t), figures(exp)]));
    return sec;
  }

  /* ---------------------------------------------------------------- one method everywhere */
  function select(method) {
    state.method = state.method === method ? "" : method;
    update();
    if (state.method) document.getElementById("method-panel").scrollIntoView({block: "nearest"});
  }

  function methodPanel(panel) {
    panel.textContent = "";
    panel.hidden = !state.method;
    if (!state.method) return;
    var keys = [];
    D.experiments.forEach(function (e) { e.metrics.forEach(function (k) { if (keys.indexOf(k) < 0) keys.push(k); }); });
    var body = D.experiments.map(function (e) {
      var row = e.rows.filter(function (r) { return r.method === state.method; })[0];
      var point = pointOf(e);
      return el("tr", {}, [el("th", {scope: "row", text: e.name + (point === "auc" ? "" : " (β = " + point + ")")})].concat(keys.map(function (k) {
        if (!row || e.metrics.indexOf(k) < 0) return el("td", {class: "num muted", text: row ? "" : "not run"});
        return cell(k, stat(row, k, point), e.level);
      })));
    });
    var rows = D.experiments.map(function (e) { return e.rows.filter(function (r) { return r.method === state.method; })[0]; }).filter(Boolean);
    var first = rows[0] || {};
    panel.appendChild(el("h2", {text: state.method + " in every experiment"}));
    panel.appendChild(el("p", {class: "note", text: PARTS.map(function (p) { return p + ": " + (first[p] || "–"); }).join(" · ")}));
    panel.appendChild(el("div", {class: "table-wrap"}, [el("table", {class: "lb"}, [el("thead", {}, [el("tr", {}, [el("th", {scope: "col", text: "Experiment"})].concat(
      keys.map(function (k) { var m = D.metrics[k] || {label: k, help: k}; return el("th", {scope: "col", title: m.help, text: m.label}); })))]), el("tbody", {}, body)])]));
    D.experiments.forEach(function (e, i) {
      var r = e.rows.filter(function (x) { return x.method === state.method; })[0];
      if (r && r.tuned) panel.appendChild(el("p", {class: "note", text: e.name + ": " + tunedText(r.tuned).replace(/\n/g, "; ")}));
      if (r && r.figures.length) panel.appendChild(el("p", {class: "links"}, [e.name + ": "].concat(
        [].concat.apply([], r.figures.map(function (f, j) { return [j ? " · " : "", el("a", {href: f[1], text: f[0]})]; })))));
    });
    panel.appendChild(el("button", {type: "button", onclick: function () { select(state.method); }, text: "Close"}));
  }

  /* ---------------------------------------------------------------- across experiments */
  var SUMMARY_KNOWN = ["experiments", "alpha", "statistics", "metrics", "left_out_metrics"];
  var ENTRY_KNOWN = ["label", "lower_is_better", "point", "methods", "left_out", "means", "ranks", "average_rank", "friedman", "posthoc", "win_rate"];

  function summarySection(S) {
    var sec = el("section", {class: "summary", "aria-labelledby": "h-summary"}, [
      el("h2", {id: "h-summary", text: "Across experiments (" + (S.experiments || []).length + ")"}),
      el("p", {class: "note", text: "Ranks within each experiment (1 = best), their average; Friedman and Nemenyi tests at α = " + S.alpha +
        "; win rates over (experiment, seed) pairs with bootstrap intervals. " + Object.keys(S.statistics || {}).map(function (k) { return k + ": " + S.statistics[k]; }).join(" · ")})]);
    Object.keys(S.metrics || {}).forEach(function (key) { sec.appendChild(summaryMetric(key, S.metrics[key], S)); });
    if (S.left_out_metrics && Object.keys(S.left_out_metrics).length)
      sec.appendChild(el("details", {}, [el("summary", {text: "Metrics not ranked"}), generic(S.left_out_metrics)]));
    Object.keys(S).filter(function (k) { return SUMMARY_KNOWN.indexOf(k) < 0; }).forEach(function (k) {
      sec.appendChild(el("section", {class: "extra"}, [el("h3", {text: k.replace(/_/g, " ")}), generic(S[k])]));
    });
    return sec;
  }

  function friedmanText(e) {
    var f = e.friedman || {}, post = e.posthoc || {};
    if (f.reason) return "Friedman and Nemenyi tests " + f.reason + ".";
    return "Friedman χ² = " + fmt(f.statistic, 2) + ", p = " + fmtP(f.p_value) + " (" + f.n_methods + " methods, " + f.n_experiments +
      " experiments)" + (post.critical_difference !== undefined && post.critical_difference !== null ? "; Nemenyi critical difference " + fmt(post.critical_difference, 2) : "") + ".";
  }

  function summaryMetric(key, e, S) {
    var m = D.metrics[key] || {label: e.label, help: e.label};
    var wr = e.win_rate || {}, avg = e.average_rank || {};
    var methods = (e.methods || []).slice().sort(function (a, b) { return avg[a] - avg[b] || (a < b ? -1 : 1); });
    var exps = S.experiments || [];
    var body = methods.map(function (name) {
      var ov = (wr.overall || {})[name];
      var tr = el("tr", {"data-method": name}, [el("th", {scope: "row", class: "method"}, [el("button", {type: "button", class: "linkish",
        onclick: function () { select(name); }, text: name})]), el("td", {class: "num", text: fmt(avg[name], 2)})].concat(
        exps.map(function (x) { return el("td", {class: "num", title: "mean " + fmt(((e.means || {})[x] || {})[name], 4), text: fmt(((e.ranks || {})[x] || {})[name], 1)}); }),
        [el("td", {class: "num", title: ov ? "win rate " + fmt(ov.rate) + ", " + Math.round(100 * (wr.level || 0.95)) + "% bootstrap interval [" + fmt(ov.low) + ", " + fmt(ov.high) + "]" : "",
          text: ov ? fmt(ov.rate, 2) + " [" + fmt(ov.low, 2) + ", " + fmt(ov.high, 2) + "]" : "–"})]));
      summaryRows.push({name: name, tr: tr});
      return tr;
    });
    var head = el("tr", {}, [el("th", {scope: "col", text: "Method"}), el("th", {scope: "col", title: "average rank over the experiments, 1 = best", text: "Avg rank"})].concat(
      exps.map(function (x) { return el("th", {scope: "col", title: "rank in " + x, text: x}); }),
      [el("th", {scope: "col", title: "overall win rate against the other ranked methods, with its bootstrap interval", text: "Win rate [interval]"})]));
    var box = el("section", {class: "summary-metric", "data-metric": key}, [el("h3", {title: m.help, text: (m.label || key) + (e.lower_is_better ? " ↓" : " ↑")}),
      el("p", {class: "note", text: friedmanText(e)})]);
    var grid = el("div", {class: "exp-grid"}, [el("div", {class: "table-wrap"}, [el("table", {class: "lb"}, [el("thead", {}, [head]), el("tbody", {}, body)])])]);
    if (D.cd[key]) grid.appendChild(el("figure", {class: "figs"}, [el("img", {src: D.cd[key], alt: "critical-difference diagram of " + (m.label || key) + ": average ranks, bars join methods not significantly different"}),
      el("figcaption", {text: "Critical-difference diagram (the run's figure)"})]));
    box.appendChild(grid);
    if (wr.rate) box.appendChild(el("details", {}, [el("summary", {text: "Win-rate matrix (row beats column)"}), winMatrix(wr, methods)]));
    if (e.left_out && Object.keys(e.left_out).length) box.appendChild(el("details", {}, [el("summary", {text: "Methods not ranked (" + Object.keys(e.left_out).length + ")"}), generic(e.left_out)]));
    Object.keys(e).filter(function (k) { return ENTRY_KNOWN.indexOf(k) < 0; }).forEach(function (k) {
      box.appendChild(el("details", {open: true}, [el("summary", {text: k.replace(/_/g, " ")}), generic(e[k])]));
    });
    return box;
  }

  function winMatrix(wr, methods) {
    return el("div", {class: "table-wrap"}, [el("table", {class: "lb matrix"}, [el("thead", {}, [el("tr", {}, [el("th", {text: ""})].concat(
      methods.map(function (c) { return el("th", {scope: "col", text: c}); })))]), el("tbody", {}, methods.map(function (r) {
        return el("tr", {}, [el("th", {scope: "row", text: r})].concat(methods.map(function (c) {
          var v = ((wr.rate || {})[r] || {})[c];
          return el("td", {class: "num", title: v === null || v === undefined ? "" : r + " beats " + c + ": " + fmt(v) + " [" + fmt(((wr.low || {})[r] || {})[c]) + ", " + fmt(((wr.high || {})[r] || {})[c]) + "]",
            text: fmt(v, 2)});
        })));
      }))])]);
  }

  /* ---------------------------------------------------------------- page */
  function controls() {
    var opts = {};
    PARTS.forEach(function (p) { opts[p] = []; });
    D.experiments.forEach(function (e) { e.rows.forEach(function (r) { PARTS.forEach(function (p) { if (r[p] && opts[p].indexOf(r[p]) < 0) opts[p].push(r[p]); }); }); });
    var ui = {};
    ui.filter = el("input", {type: "search", id: "filter", placeholder: "method, scheme, selector…", oninput: function () { state.filter = ui.filter.value; update(); }});
    var form = el("form", {class: "controls", role: "search", onsubmit: function (ev) { ev.preventDefault(); }}, [
      el("label", {for: "filter", text: "Filter methods "}), ui.filter]);
    PARTS.forEach(function (p) {
      ui[p] = el("select", {id: "f-" + p, onchange: function () { state[p] = ui[p].value; update(); }},
        [el("option", {value: "", text: "any"})].concat(opts[p].sort().map(function (v) { return el("option", {value: v, text: v}); })));
      form.appendChild(el("label", {for: "f-" + p, text: p + " "}));
      form.appendChild(ui[p]);
    });
    ui.iv = el("input", {type: "checkbox", id: "show-iv", onchange: function () { state.iv = ui.iv.checked; update(); }});
    form.appendChild(el("label", {class: "check"}, [ui.iv, " intervals"]));
    form.appendChild(el("button", {type: "button", onclick: function () { history.replaceState(null, "", location.pathname); readHash(); update(); }, text: "Reset view"}));
    ui.count = el("span", {class: "count", role: "status"});
    form.appendChild(ui.count);
    return {form: form, ui: ui};
  }

  function footer(P) {
    var keys = ["selbench", "plugins", "python", "torch", "numpy", "device", "device_name", "cpu", "cpu_capability", "threads",
      "platform", "spec_name", "spec_hash", "spec_source", "git_commit", "date", "seeds", "cells"];
    var shown = {};
    keys.forEach(function (k) { if (P[k] !== undefined) shown[k] = P[k]; });
    var rest = {};
    Object.keys(P).forEach(function (k) { if (keys.indexOf(k) < 0) rest[k] = P[k]; });
    return el("footer", {class: "prov"}, [el("h2", {text: "Provenance"}), generic(shown),
      el("details", {}, [el("summary", {text: "Everything else the run recorded"}), generic(rest)])]);
  }

  var app = document.getElementById("app"), C = controls(), panel = el("section", {id: "method-panel", class: "panel", hidden: true});
  var P = D.provenance || {};
  app.appendChild(el("header", {}, [el("h1", {text: "Leaderboard: " + D.title}), D.description ? el("p", {text: D.description}) : null,
    el("p", {class: "note", text: "selbench " + (P.selbench || "?") + " · spec hash " + String(P.spec_hash || "").slice(0, 12) + " · seeds " + (P.seeds || []).join(", ") +
      " · mean ± std over seeds · bold: best, and not significantly worse than it (" + ((D.statistics || {}).test || "") + ") · ↓ lower is better, ↑ higher is better · hover a value for its intervals, a header for the metric"}),
    C.form, D.experiments.length > 1 ? el("nav", {"aria-label": "experiments"}, ["Experiments: "].concat([].concat.apply([], D.experiments.map(function (e, i) {
      return [i ? " · " : "", el("button", {type: "button", class: "linkish", onclick: function () { document.getElementById("exp-" + e.name).scrollIntoView(); }, text: e.name})];
    })))) : null]));
  app.appendChild(panel);
  D.experiments.forEach(function (e) { app.appendChild(experiment(e)); });
  if (D.summary) app.appendChild(summarySection(D.summary));
  app.appendChild(footer(P));

  function update() {
    C.ui.filter.value = state.filter;
    PARTS.forEach(function (p) { C.ui[p].value = state[p]; });
    C.ui.iv.checked = state.iv;
    document.body.classList.toggle("show-iv", state.iv);
    var shown = 0, total = 0;
    tables.forEach(function (t) {
      if (t.betaSelect) t.betaSelect.value = pointOf(t.exp);
      if (t.point !== pointOf(t.exp)) fillRows(t);
      order(t);
      t.rows.forEach(function (r) { total++; if (!r.tr.hidden) shown++; });
      drawChart(t);
    });
    summaryRows.forEach(function (s) {
      var row = null;
      D.experiments.forEach(function (e) { e.rows.forEach(function (r) { if (r.method === s.name && !row) row = r; }); });
      s.tr.hidden = row ? !visible(row) : false;
      s.tr.classList.toggle("selected", s.name === state.method);
    });
    C.ui.count.textContent = shown + " of " + total + " rows shown";
    methodPanel(panel);
    writeHash();
  }

  readHash();
  update();
  window.addEventListener("hashchange", function () { readHash(); update(); });
});
