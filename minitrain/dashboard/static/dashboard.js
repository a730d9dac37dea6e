// minitrain dashboard: draws the plots (uPlot) from the data embedded in the page and, while the run
// is live, polls the server every 2 s: /parts (the server-rendered sections), /api/metrics and
// /api/samples (only what is new), /api/nodes (the hosts' total memory). The tables are rendered by
// the server only.
(function () {
  "use strict";
  var POLL_MS = 2000;
  var initial = JSON.parse(document.getElementById("initial-data").textContent);
  var live = initial.live;
  var reports = initial.metrics.slice();
  var samples = initial.samples.slice();
  var nodes = initial.nodes || [];  // the current attempt's hosts: [{host, memory_bytes}]
  var metricPlots = {};  // metric name -> uPlot
  var timeline = null;
  var palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                 "#bcbd22", "#17becf"];

  function width(el) { return Math.max(320, (el.clientWidth || 800) - 8); }

  function isNumber(v) { return typeof v === "number" && isFinite(v); }

  // Numbers on the plots, one formatter for every axis and legend. The unit is chosen from the size of
  // the numbers shown and the decimals from the spacing of the ticks, so ticks always read apart: uPlot's
  // own labels keep at most 3 decimals, and waits of a fraction of a millisecond read "0" on every tick.
  // kind: "seconds", "bytes", "share" (0..1, shown in %), "percent" (already in %) or "number"
  // ("count" for an axis of whole numbers).
  var UNITS = {  // [scale, suffix, used from]: the last unit whose "from" the numbers reach is used
    seconds: [[1e-6, " µs", 0], [1e-3, " ms", 1e-3], [1, " s", 1], [60, " min", 300], [3600, " h", 3 * 3600]],
    bytes: [[1, " B", 0], [1024, " KiB", 1024], [1048576, " MiB", 1048576], [1073741824, " GiB", 1073741824],
            [1099511627776, " TiB", 1099511627776]],
    share: [[0.01, "%", 0]],
    percent: [[1, "%", 0]],
    number: [[1, "", 0]],
  };

  function unitFor(kind, magnitude) {
    var units = UNITS[kind] || UNITS.number, chosen = units[0];
    units.forEach(function (u) { if (magnitude >= u[2] || (magnitude === 0 && u[0] === 1)) { chosen = u; } });
    return chosen;  // nothing but zeros: the base unit ("0 s", not "0 µs")
  }

  // The tick spacings uPlot may choose from, so that ticks fall on round numbers of the unit shown:
  // 1-2-5 steps of each binary unit for bytes (decimal steps give "95.3674 MiB"), whole minutes and
  // hours for long times, whole numbers for counts; other kinds keep uPlot's decimal 1-2-5 steps.
  function steps(multiples, scales) {
    var out = [];
    scales.forEach(function (scale) { multiples.forEach(function (m) { out.push(m * scale); }); });
    return out;
  }
  var DECIMAL = steps([1, 2, 5], [1e-9, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1]);
  var INCRS = {
    seconds: DECIMAL.concat([1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
                             43200, 86400, 172800, 432000, 864000]),
    bytes: steps([1, 2, 5, 10, 20, 50, 100, 200, 500], [1, 1024, 1048576, 1073741824, 1099511627776]),
    count: steps([1, 2, 5], [1, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9]),
  };

  // The decimals that tell apart numbers `step` apart (a step of 2.5 needs one more than a step of 2).
  function decimalsFor(step) {
    if (!(step > 0) || !isFinite(step)) { return 0; }
    for (var d = Math.max(0, -Math.floor(Math.log10(step))); d < 12; d++) {
      var scaled = step * Math.pow(10, d);
      if (Math.abs(scaled - Math.round(scaled)) < 1e-6 * Math.max(1, scaled)) { return d; }
    }
    return 12;
  }

  // A plain number too large or too small for decimals is written with an exponent.
  function wantsExponent(kind, magnitude) {
    return kind === "number" && magnitude > 0 && (magnitude >= 1e7 || magnitude < 1e-3);
  }

  function fixed(x, decimals, suffix) {
    if (Math.abs(x) < 0.5 * Math.pow(10, -decimals)) { x = 0; }  // never "-0.00"
    return x.toFixed(decimals) + suffix;
  }

  // The labels of ticks at `values` (`step` apart; uPlot's increment): one unit for all of them.
  function tickLabels(kind, values, step) {
    var shown = values.filter(isNumber);
    var magnitude = shown.reduce(function (m, v) { return Math.max(m, Math.abs(v)); }, 0);
    if (!(step > 0) && shown.length > 1) { step = Math.abs(shown[1] - shown[0]); }
    var labels;
    if (wantsExponent(kind, magnitude)) {
      var digits = step > 0 ? Math.max(0, Math.floor(Math.log10(magnitude)) - Math.floor(Math.log10(step))) : 2;
      labels = values.map(function (v) { return isNumber(v) ? (v === 0 ? "0" : v.toExponential(Math.min(digits, 6))) : ""; });
    } else {
      var unit = unitFor(kind, magnitude), decimals = decimalsFor(step / unit[0]);
      labels = values.map(function (v) { return isNumber(v) ? fixed(v / unit[0], decimals, unit[1]) : ""; });
    }
    return labels;
  }

  // One value (a legend's): three significant digits in the unit its own size chooses.
  function formatValue(kind, v) {
    if (!isNumber(v)) { return "–"; }
    if (wantsExponent(kind, Math.abs(v))) { return v.toExponential(2); }
    var unit = unitFor(kind, Math.abs(v)), x = v / unit[0];
    return fixed(x, x === 0 ? 0 : Math.max(0, 2 - Math.floor(Math.log10(Math.abs(x)))), unit[1]);
  }

  // An axis whose ticks read in `kind`'s unit (tickLabels), as wide as its longest label. The labels
  // drawn are also kept on the plot's element as data-<which>-ticks ("|" between them): a canvas is
  // opaque to the page's DOM, and the browser test and assistive tools read them there.
  function valueAxis(kind, label, which) {
    var count = kind === "count";
    if (count) { kind = "number"; }  // whole numbers (report indexes): ticks never between two
    return {
      label: label,
      incrs: INCRS[count ? "count" : kind],
      values: function (u, splits, axisIdx, space, incr) {
        var labels = tickLabels(kind, splits, incr);
        u.root.setAttribute("data-" + which + "-ticks", labels.join("|"));
        return labels;
      },
      size: which === "y" ? function (u, values, axisIdx, cycleNum) {
        var axis = u.axes[axisIdx];
        if (cycleNum > 1 && axis._size) { return axis._size; }  // settle: uPlot re-asks until sizes converge
        var longest = (values || []).reduce(function (a, v) { return String(v).length > a.length ? String(v) : a; }, "");
        u.ctx.font = axis.font[0];
        var text = u.ctx.measureText(longest).width / (window.devicePixelRatio || 1);
        return Math.max(40, Math.ceil(axis.ticks.size + axis.gap + text + 4));
      } : undefined,
    };
  }

  function metricNames() {
    var seen = {}, names = [];
    reports.forEach(function (r) {
      Object.keys(r.metrics || {}).forEach(function (k) {
        if (isNumber(r.metrics[k]) && !seen[k]) { seen[k] = true; names.push(k); }
      });
    });
    return names;
  }

  function metricData(name) {
    var xs = [], ys = [];
    reports.forEach(function (r) {
      var v = (r.metrics || {})[name];
      if (isNumber(v)) { xs.push(r.index); ys.push(v); }
    });
    return [xs, ys];
  }

  function drawMetrics() {
    var box = document.getElementById("metric-plots");
    metricNames().forEach(function (name) {
      var data = metricData(name);
      if (metricPlots[name]) { metricPlots[name].setData(data); return; }
      var holder = document.createElement("div");
      holder.className = "metric-plot";
      holder.setAttribute("data-metric", name);
      box.appendChild(holder);
      metricPlots[name] = new uPlot({
        title: name, width: Math.min(width(box), 560), height: 220,
        scales: { x: { time: false } },
        axes: [valueAxis("count", "report", "x"), valueAxis("number", "", "y")],
        series: [{ label: "report", value: function (u, v) { return v == null ? "–" : String(v); } },
                 { label: name, stroke: palette[0], width: 2,
                   value: function (u, v) { return formatValue("number", v); } }],
      }, data, holder);
    });
    if (!metricNames().length && !box.querySelector(".empty")) {
      box.innerHTML = '<p class="empty">no numeric metric reported yet</p>';
    } else if (metricNames().length) {
      var empty = box.querySelector(".empty");
      if (empty) { empty.remove(); }
    }
  }

  function timelineData() {
    var ranks = {}, times = {}, rankList = [];
    samples.forEach(function (s) {
      // Step time is the rank's own work (waits for the other ranks excluded), as the console and the
      // straggler rule judge it; the waits have a plot of their own.
      var work = isNumber(s.work_time_s) ? s.work_time_s : null;
      if (work === null) { return; }
      if (!(s.rank in ranks)) { ranks[s.rank] = {}; rankList.push(s.rank); }
      ranks[s.rank][s.time] = work;
      times[s.time] = true;
    });
    rankList.sort(function (a, b) { return a - b; });
    var xs = Object.keys(times).map(Number).sort(function (a, b) { return a - b; });
    var data = [xs];
    rankList.forEach(function (r) {
      data.push(xs.map(function (t) { return t in ranks[r] ? ranks[r][t] : null; }));
    });
    return { ranks: rankList, data: data };
  }

  function stragglerRanks() {
    var out = {};
    document.querySelectorAll("#ranks tr.straggler").forEach(function (tr) { out[tr.dataset.rank] = true; });
    return out;
  }

  function drawTimeline() {
    var box = document.getElementById("timeline");
    var t = timelineData();
    var key = t.ranks.join(",") + "|" + Object.keys(stragglerRanks()).join(",");
    if (timeline && timeline._key === key) { timeline.setData(t.data); return; }
    if (timeline) { timeline.destroy(); timeline = null; }
    if (!t.ranks.length) { box.innerHTML = '<p class="empty">no step time measured yet</p>'; return; }
    box.innerHTML = "";
    var slow = stragglerRanks();
    var series = [{}].concat(t.ranks.map(function (r, i) {
      return { label: "rank " + r + (slow[r] ? " (straggler)" : ""), stroke: palette[i % palette.length],
               width: slow[r] ? 3 : 1.5, dash: slow[r] ? [6, 3] : undefined, spanGaps: true,
               value: function (u, v) { return formatValue("seconds", v); } };
    }));
    timeline = new uPlot({
      width: width(box), height: 260, series: series,
      axes: [{}, valueAxis("seconds", "step time", "y")],
    }, t.data, box);
    timeline._key = key;
  }

  // Series over time from the samples: pick(s) gives [[label, value], ...] for one sample; x is the
  // sample's time (rounded to the second with round: samples of several ranks then line up).
  // constants: [[label, value], ...] drawn as flat lines over the whole time range (a host's total).
  function seriesFrom(pick, round, constants) {
    var byLabel = {}, labels = [], times = {};
    samples.forEach(function (s) {
      var t = round ? Math.round(s.time) : s.time;
      pick(s).forEach(function (pair) {
        if (!isNumber(pair[1])) { return; }
        if (!(pair[0] in byLabel)) { byLabel[pair[0]] = {}; labels.push(pair[0]); }
        byLabel[pair[0]][t] = (byLabel[pair[0]][t] || 0) + pair[1];
        times[t] = true;
      });
    });
    var xs = Object.keys(times).map(Number).sort(function (a, b) { return a - b; });
    var data = [xs];
    labels.forEach(function (l) {
      data.push(xs.map(function (t) { return t in byLabel[l] ? byLabel[l][t] : null; }));
    });
    if (xs.length) {
      (constants || []).forEach(function (pair) {
        if (!isNumber(pair[1])) { return; }
        labels.push(pair[0]);
        data.push(xs.map(function () { return pair[1]; }));
      });
    }
    return { labels: labels, data: data };
  }

  var plots = {};  // element id -> uPlot

  function drawSeries(id, pick, opts) {
    var box = document.getElementById(id);
    if (!box) { return; }
    var t = seriesFrom(pick, opts.round, opts.constants);
    var key = t.labels.join(",");
    if (plots[id] && plots[id]._key === key) { plots[id].setData(t.data); return; }
    if (plots[id]) { plots[id].destroy(); delete plots[id]; }
    if (!t.labels.length) { box.innerHTML = '<p class="empty">' + opts.empty + '</p>'; return; }
    box.innerHTML = "";
    var series = [{}].concat(t.labels.map(function (l, i) {
      return { label: l, stroke: palette[i % palette.length], width: 1.5, spanGaps: true,
               dash: l.indexOf(" total") >= 0 ? [2, 4] : l.indexOf("node") === 0 || l.indexOf("idle") >= 0 ? [6, 3] : undefined,
               value: function (u, v) { return formatValue(opts.kind, v); } };
    }));
    plots[id] = new uPlot({ title: opts.title, width: width(box), height: 220, series: series,
                            axes: [{}, valueAxis(opts.kind, opts.axis, "y")] }, t.data, box);
    plots[id]._key = key;
  }

  function drawDiagnoses() {
    drawSeries("waits", function (s) {
      return [["rank " + s.rank + " report()", s.report_wait_s], ["rank " + s.rank + " collective", s.collective_wait_s]];
    }, { title: "", axis: "wait per step", empty: "no wait measured yet", kind: "seconds" });
    drawSeries("idle", function (s) {
      if (!isNumber(s.step_time_s) || s.step_time_s <= 0) { return []; }
      var waits = [s.data_wait_s, s.report_wait_s, s.collective_wait_s].filter(isNumber);
      var idle = waits.reduce(function (a, b) { return a + b; }, 0);
      return [["rank " + s.rank + " data wait", isNumber(s.data_wait_s) ? Math.min(s.data_wait_s / s.step_time_s, 1) : null],
              ["rank " + s.rank + " idle (all waits)", Math.min(idle / s.step_time_s, 1)]];
    }, { title: "", axis: "share of the step", empty: "no step measured yet", kind: "share" });
    drawSeries("memory", function (s) {
      return [["rank " + s.rank, s.rss_bytes]];
    }, { round: true, title: "per rank", axis: "RSS", empty: "no memory measured yet", kind: "bytes" });
    // Per node: the sum of its ranks' RSS, against the host's total memory (its agent's figure).
    // The totals set the scale; a click on one's legend entry hides it and zooms in on the ranks.
    drawSeries("node-memory", function (s) {
      return [["node " + s.host + " (its ranks)", s.rss_bytes]];
    }, { round: true, title: "per node, against the host's total", axis: "RSS", empty: "", kind: "bytes",
         constants: nodes.map(function (n) {
           return ["node " + n.host + " total (" + (n.memory_bytes / 1073741824).toFixed(1) + " GiB)",
                   n.memory_bytes];
         }) });
    drawSeries("gpu-util", function (s) {
      return (s.gpus || []).map(function (g) { return ["rank " + s.rank + " GPU " + g.index, g.util_percent]; });
    }, { title: "GPU utilisation", axis: "utilisation", empty: "no GPU measured (no NVML or no GPU on the workers)",
         kind: "percent" });
    drawSeries("gpu-memory", function (s) {
      return (s.gpus || []).map(function (g) { return ["rank " + s.rank + " GPU " + g.index, g.memory_used_bytes]; });
    }, { title: "GPU memory used", axis: "memory used", empty: "", kind: "bytes" });
  }

  function replaceParts(parts) {
    Object.keys(parts).forEach(function (id) {
      var old = document.getElementById(id);
      if (!old) { return; }
      var holder = document.createElement("div");
      holder.innerHTML = parts[id];
      if (holder.firstElementChild) { old.replaceWith(holder.firstElementChild); }
    });
  }

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", cache: "no-store" }).then(function (r) {
      if (!r.ok) { throw new Error(url + ": HTTP " + r.status); }
      return r.json();
    });
  }

  // The server marks the overview once the run reached its terminal state: then polling stops.
  function ended() { return ((document.getElementById("overview") || {}).dataset || {}).ended === "true"; }

  function poll() {
    var lastIndex = reports.length ? reports[reports.length - 1].index : -1;
    var lastTime = samples.length ? samples[samples.length - 1].time : 0;
    Promise.all([
      getJSON("parts"),
      getJSON("api/metrics?since_index=" + lastIndex),
      getJSON("api/samples?since=" + lastTime),
      getJSON("api/nodes"),
    ]).then(function (got) {
      replaceParts(got[0]);
      reports = reports.concat(got[1]);
      samples = samples.concat(got[2]);
      nodes = got[3];
      drawMetrics();
      drawTimeline();
      drawDiagnoses();
      document.body.classList.remove("stale");
    }).catch(function () {
      document.body.classList.add("stale");  // the run ended and its server with it, or a blip
    }).then(function () {
      if (!ended()) { setTimeout(poll, POLL_MS); }
    });
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest("button.stacks");
    if (!button) { return; }
    var out = document.getElementById("stack-output");
    var rank = button.dataset.rank;
    button.disabled = true;
    out.hidden = false;
    out.textContent = "asking rank " + rank + " for its stacks...";
    fetch("api/ranks/" + encodeURIComponent(rank) + "/stacks", {
      method: "POST", credentials: "same-origin", headers: { "X-Minitrain-Dashboard": "1" },
    }).then(function (r) {
      return r.text().then(function (text) { out.textContent = "rank " + rank + ":\n" + text; });
    }).catch(function (err) { out.textContent = String(err); })
      .then(function () { button.disabled = false; });
  });

  drawMetrics();
  drawTimeline();
  drawDiagnoses();
  if (live && !ended()) { setTimeout(poll, POLL_MS); }
})();
