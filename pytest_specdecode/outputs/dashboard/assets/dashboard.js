// pytest-specdecode dashboard: draws the SVG charts and sparklines, applies the filters, and
// fills in a night's run-level samples when its <details> is opened. No library, nothing
// fetched: the data is the JSON inlined in the page (file:// allows no fetch of local files).
"use strict";
(function () {
  var SVG = "http://www.w3.org/2000/svg";

  function el(name, attrs, parent) {
    var node = document.createElementNS(SVG, name);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (parent) parent.appendChild(node);
    return node;
  }

  function title(node, text) { el("title", {}, node).textContent = text; return node; }

  function fmt(v) { return v === null || v === undefined ? "-" : Number(v).toPrecision(4); }

  // A path through (x, y) points, broken where a night is missing (y null) or skipped (a gap).
  function linePath(xs, ys, sx, sy) {
    var d = "", prev = null;
    for (var i = 0; i < xs.length; i++) {
      if (ys[i] === null || ys[i] === undefined) { prev = null; continue; }
      var joined = prev !== null && xs[i] - xs[prev] === 1;
      d += (joined ? "L" : "M") + sx(xs[i]).toFixed(1) + " " + sy(ys[i]).toFixed(1);
      prev = i;
    }
    return d;
  }

  function extent(lists) {
    var lo = Infinity, hi = -Infinity;
    lists.forEach(function (list) {
      (list || []).forEach(function (v) {
        if (v !== null && v !== undefined) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
      });
    });
    if (!isFinite(lo)) { lo = 0; hi = 1; }
    if (hi === lo) { hi = lo + Math.abs(lo || 1) * 0.05; lo = lo - Math.abs(lo || 1) * 0.05; }
    var pad = (hi - lo) * 0.08;
    return [lo - pad, hi + pad];
  }

  function scale(d0, d1, r0, r1) {
    return function (v) { return r0 + (v - d0) / (d1 - d0 || 1) * (r1 - r0); };
  }

  // ------------------------------------------------------------------ overview sparklines

  function drawSpark(svg) {
    var data = JSON.parse(svg.getAttribute("data-spark"));
    var w = +svg.getAttribute("width"), h = +svg.getAttribute("height");
    var xs = data.x, ys = data.y;
    if (!xs.length) return;
    var yr = extent([ys]);
    var sx = scale(xs[0], Math.max(xs[xs.length - 1], xs[0] + 1), 2, w - 2);
    var sy = scale(yr[0], yr[1], h - 2, 2);
    el("path", { "class": "mean", d: linePath(xs, ys, sx, sy) }, svg);
  }

  // ------------------------------------------------------------------ overview filters

  function applyFilters() {
    var wanted = {};
    document.querySelectorAll("select[data-filter]").forEach(function (s) {
      if (s.value) wanted[s.getAttribute("data-filter")] = s.value;
    });
    var rows = document.querySelectorAll("#overview tr.series"), shown = 0;
    rows.forEach(function (row) {
      var keep = Object.keys(wanted).every(function (k) {
        return row.getAttribute("data-" + k) === wanted[k];
      });
      row.hidden = !keep;
      if (keep) shown++;
    });
    document.getElementById("shown").textContent =
      "showing " + shown + " of " + rows.length + " series";
    var hash = Object.keys(wanted).map(function (k) {
      return k + "=" + encodeURIComponent(wanted[k]);
    }).join("&");
    history.replaceState(null, "", hash ? "#" + hash : location.pathname + location.search);
  }

  // The filters a link or bookmark names (index.html#hardware=h200&profile=eagle3) are set on
  // the selects and go through the same change handler as a click.
  function setupFilters() {
    var selects = document.querySelectorAll("select[data-filter]");
    if (!selects.length) return;
    selects.forEach(function (s) { s.addEventListener("change", applyFilters); });
    var given = new URLSearchParams(location.hash.replace(/^#/, "") || location.search);
    selects.forEach(function (s) {
      var value = given.get(s.getAttribute("data-filter"));
      if (value !== null) {
        s.value = value;
        s.dispatchEvent(new Event("change"));
      }
    });
    if (!document.getElementById("shown").textContent.match(/of/)) applyFilters();
  }

  // ------------------------------------------------------------------ a series' charts

  var W = 820, H = 230, L = 64, R = 16, T = 12, B = 34;

  function drawChart(fig, series, metric) {
    var c = series.metrics[metric], xs = series.nights.x;
    var lowBand = c.base.map(function (b, i) { return b === null ? null : b - (c.base_sd[i] || 0); });
    var highBand = c.base.map(function (b, i) { return b === null ? null : b + (c.base_sd[i] || 0); });
    var yr = extent([c.mean, c.lo, c.hi, lowBand, highBand, c.threshold]);
    var x0 = xs[0], x1 = Math.max(xs[xs.length - 1], x0 + 1);
    var sx = scale(x0 - 0.5, x1 + 0.5, L, W - R), sy = scale(yr[0], yr[1], H - B, T);
    var svg = el("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H,
                          "data-metric": metric }, null);
    fig.appendChild(svg);
    // axes and labels
    el("path", { "class": "axis", d: "M" + L + " " + T + "V" + (H - B) + "H" + (W - R) }, svg);
    for (var t = 0; t <= 4; t++) {
      var v = yr[0] + (yr[1] - yr[0]) * t / 4;
      el("text", { x: L - 6, y: sy(v) + 4, "text-anchor": "end" }, svg).textContent = fmt(v);
    }
    var step = Math.max(1, Math.ceil(xs.length / 6));
    for (var k = 0; k < xs.length; k += step) {
      var label = el("text", { x: sx(xs[k]), y: H - B + 16, "text-anchor": "middle" }, svg);
      label.textContent = "night " + (xs[k] + 1) + " · " + String(series.nights.when[k]).slice(5, 10);
    }
    // markers behind the data: gaps, re-recorded baselines, renames, changes, errors
    series.markers.forEach(function (m) {
      if (m.kind === "change" && m.metric !== metric) return;
      var x = sx(m.x), node;
      if (m.kind === "gap") {
        node = el("rect", { "class": "m-gap", x: sx(m.x - 0.5), y: T,
                            width: sx(m.x2 + 0.5) - sx(m.x - 0.5), height: H - B - T }, svg);
      } else if (m.kind === "error") {
        node = el("path", { "class": "m-error", d: "M" + (x - 4) + " " + (H - B - 8) + "l8 8m0 -8l-8 8" }, svg);
      } else {
        node = el("path", { "class": "m-" + m.kind, "data-x": m.x,
                            d: "M" + x + " " + T + "V" + (H - B) }, svg);
        if (m.kind === "change") {
          el("text", { x: x + 4, y: T + 10, "class": "change-label" }, svg).textContent =
            m.label.split(",")[0];
        }
      }
      title(node, "night " + (m.x + 1) + ": " + m.label + (m.changed ? "\n" + m.changed.join("\n") : ""));
    });
    // the baseline's band and mean, the margin line
    // one band per stretch of nights with the same baseline: a re-recorded one starts anew
    splitRuns(xs, c.base).forEach(function (run) {
      var top = run.map(function (i) { return sx(xs[i]).toFixed(1) + " " + sy(highBand[i]).toFixed(1); });
      var bottom = run.slice().reverse().map(function (i) {
        return sx(xs[i]).toFixed(1) + " " + sy(lowBand[i]).toFixed(1);
      });
      el("path", { "class": "band", d: "M" + top.join("L") + "L" + bottom.join("L") + "Z" }, svg);
    });
    el("path", { "class": "baseline", d: linePath(xs, c.base, sx, sy) }, svg);
    el("path", { "class": "threshold", d: linePath(xs, c.threshold, sx, sy) }, svg);
    // each night: its interval, its mean, joined night to night
    var whiskers = "";
    xs.forEach(function (x, i) {
      if (c.lo[i] !== null && c.hi[i] !== null) {
        whiskers += "M" + sx(x).toFixed(1) + " " + sy(c.lo[i]).toFixed(1) + "V" + sy(c.hi[i]).toFixed(1);
      }
    });
    el("path", { "class": "whisker", d: whiskers }, svg);
    el("path", { "class": "mean", d: linePath(xs, c.mean, sx, sy) }, svg);
    xs.forEach(function (x, i) {
      if (c.mean[i] === null) return;
      var outcome = series.nights.outcome[i];
      var cls = outcome === "fail" ? "bad" : outcome === "inconclusive" ? "warn" : "";
      var dot = el("circle", { "class": "night " + cls, cx: sx(x), cy: sy(c.mean[i]), r: 2.5 }, svg);
      title(dot, "night " + (x + 1) + " (" + series.nights.when[i] + "): " + fmt(c.mean[i]) + " " + c.unit +
        " [" + fmt(c.lo[i]) + ", " + fmt(c.hi[i]) + "], " + outcome +
        (series.nights.simulated[i] ? " (simulated)" : ""));
    });
  }

  // Index runs of consecutive nights that have the same value.
  function splitRuns(xs, values) {
    var runs = [], run = [];
    xs.forEach(function (x, i) {
      var last = run.length ? run[run.length - 1] : null;
      if (values[i] === null || (last !== null && (x - xs[last] !== 1 || values[i] !== values[last]))) {
        if (run.length) runs.push(run);
        run = [];
      }
      if (values[i] !== null) run.push(i);
    });
    if (run.length) runs.push(run);
    return runs;
  }

  // ------------------------------------------------------------------ run-level samples

  function fillSamples(details, series) {
    if (details.querySelector("table")) return;
    var i = +details.getAttribute("data-i");
    var table = document.createElement("table"), head = "<tr><th>run</th>", names = Object.keys(series.samples);
    names.forEach(function (m) { head += "<th>" + (series.metrics[m] ? series.metrics[m].label : m) + "</th>"; });
    var count = Math.max.apply(null, names.map(function (m) { return series.samples[m][i].length; }));
    var body = "";
    for (var r = 0; r < count; r++) {
      body += "<tr><td>" + (r + 1) + "</td>" + names.map(function (m) {
        return "<td>" + fmt(series.samples[m][i][r]) + "</td>";
      }).join("") + "</tr>";
    }
    table.innerHTML = head + "</tr>" + body;
    details.appendChild(table);
  }

  // ------------------------------------------------------------------ start

  function start() {
    document.querySelectorAll("svg.spark").forEach(drawSpark);
    setupFilters();
    var data = document.getElementById("specdecode-data");
    if (data) {
      var series = JSON.parse(data.textContent);
      document.querySelectorAll("figure.chart").forEach(function (fig) {
        drawChart(fig, series, fig.getAttribute("data-metric"));
      });
      document.querySelectorAll("details[data-i]").forEach(function (d) {
        d.addEventListener("toggle", function () { if (d.open) fillSamples(d, series); });
        if (d.open) fillSamples(d, series);
      });
      // a link to one night's runs (#runs=I) opens its <details>, as a click would
      var asked = /(?:^#|&)runs=(\d+)/.exec(location.hash);
      var details = asked && document.querySelector('details[data-i="' + asked[1] + '"]');
      if (details) details.open = true;
    }
    // for the browser test and the benchmark: drawn, and how long until then
    document.body.setAttribute("data-rendered", "1");
    requestAnimationFrame(function () {
      var paint = performance.getEntriesByType("paint").filter(function (p) {
        return p.name === "first-contentful-paint";
      })[0];
      document.body.setAttribute("data-drawn-ms", performance.now().toFixed(1));
      if (paint) document.body.setAttribute("data-first-paint-ms", paint.startTime.toFixed(1));
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
