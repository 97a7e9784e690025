"use strict";
/* selbench pages: helpers shared by leaderboard.js and index.js (inlined before them).
   Any error is written on <body data-error="..."> and shown; a finished script sets
   <body data-ready="1">. */
window.addEventListener("error", function (e) {
  document.body.setAttribute("data-error", String(e.message || e.error || e));
});
/* a fetch the Content-Security-Policy refused (there should be none) */
document.addEventListener("securitypolicyviolation", function (e) {
  document.body.setAttribute("data-blocked", String(e.blockedURI || e.violatedDirective));
});

function el(tag, attrs, children) {
  return fill(document.createElement(tag), attrs, children);
}

function sv(tag, attrs, children) {
  return fill(document.createElementNS("http://www.w3.org/2000/svg", tag), attrs, children);
}

function fill(node, attrs, children) {
  Object.keys(attrs || {}).forEach(function (k) {
    var v = attrs[k];
    if (v === null || v === undefined || v === false) return;
    if (k === "text") node.textContent = v;
    else if (k.slice(0, 2) === "on") node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  });
  (children || []).forEach(function (c) {
    if (c === null || c === undefined || c === false) return;
    node.appendChild(typeof c === "object" ? c : document.createTextNode(String(c)));
  });
  return node;
}

function fmt(x, digits) {
  if (x === null || x === undefined || (typeof x === "number" && !isFinite(x))) return "–";
  if (typeof x !== "number") return String(x);
  return x.toFixed(digits === undefined ? 3 : digits);
}

function fmtP(p) {
  if (p === null || p === undefined) return "–";
  return p < 0.001 ? "<0.001" : p.toFixed(3);
}

/* Any JSON value as readable HTML: tables for lists of records and records of records. */
function generic(v, depth) {
  depth = depth || 0;
  if (v === null || v === undefined) return document.createTextNode("–");
  if (typeof v !== "object") return document.createTextNode(typeof v === "number" ? fmtNum(v) : String(v));
  if (depth > 4) return el("code", {text: JSON.stringify(v).slice(0, 400)});
  if (Array.isArray(v)) {
    if (v.every(function (x) { return x === null || typeof x !== "object"; }))
      return document.createTextNode(v.map(function (x) { return typeof x === "number" ? fmtNum(x) : String(x); }).join(", "));
    if (v.every(function (x) { return x && typeof x === "object" && !Array.isArray(x); }))
      return recordTable(v.map(function (x, i) { return [String(i + 1), x]; }), depth);
    return el("ol", {}, v.map(function (x) { return el("li", {}, [generic(x, depth + 1)]); }));
  }
  var keys = Object.keys(v);
  var records = keys.length > 1 && keys.every(function (k) {
    var x = v[k];
    return x && typeof x === "object" && !Array.isArray(x) &&
      Object.keys(x).every(function (j) { return x[j] === null || typeof x[j] !== "object"; });
  });
  if (records) return recordTable(keys.map(function (k) { return [k, v[k]]; }), depth);
  return el("dl", {class: "generic"}, [].concat.apply([], keys.map(function (k) {
    return [el("dt", {text: k}), el("dd", {}, [generic(v[k], depth + 1)])];
  })));
}

function fmtNum(x) {
  if (Number.isInteger(x)) return String(x);
  return Math.abs(x) >= 1e-3 || x === 0 ? String(Number(x.toPrecision(4))) : x.toExponential(2);
}

function recordTable(pairs, depth) {
  var cols = [];
  pairs.forEach(function (p) { Object.keys(p[1]).forEach(function (k) { if (cols.indexOf(k) < 0) cols.push(k); }); });
  return el("div", {class: "table-wrap"}, [el("table", {class: "generic"}, [
    el("thead", {}, [el("tr", {}, [el("th", {scope: "col", text: ""})].concat(
      cols.map(function (c) { return el("th", {scope: "col", text: c}); })))]),
    el("tbody", {}, pairs.map(function (p) {
      return el("tr", {}, [el("th", {scope: "row", text: p[0]})].concat(cols.map(function (c) {
        return el("td", {}, [generic(p[1][c], depth + 1)]);
      })));
    }))])]);
}

function runPage(main) {
  try {
    main(JSON.parse(document.getElementById("lb-data").textContent));
    document.body.setAttribute("data-ready", "1");
    document.body.setAttribute("data-ms", String(Math.round(performance.now())));  // since navigation
    document.body.setAttribute("data-resources", String(performance.getEntriesByType("resource").filter(
      function (r) { return r.name.slice(0, 5) !== "data:"; }).length));  // fetched resources
  } catch (err) {
    document.body.setAttribute("data-error", String(err && err.stack || err));
    document.body.insertBefore(el("p", {class: "error", role: "alert",
      text: "This page could not be drawn: " + err}), document.body.firstChild);
  }
}
