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
        axes: [{ label: "report" }, {}],
        series: [{ label: "report" }, { label: name, stroke: palette[0], width: 2 }],
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
               value: function (u, v) { return v == null ? "–" : (v * 1000).toFixed(0) + " ms"; } };
    }));
    timeline = new uPlot({
      width: width(box), height: 260, series: series,
      axes: [{}, { label: "step time (s)" }],
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
               value: function (u, v) { return v == null ? "–" : opts.format(v); } };
    }));
    plots[id] = new uPlot({ title: opts.title, width: width(box), height: 220, series: series,
                            axes: [{}, { label: opts.axis }] }, t.data, box);
    plots[id]._key = key;
  }

  function toMib(v) { return isNumber(v) ? v / 1048576 : null; }
  function mib(v) { return v.toFixed(0) + " MiB"; }
  function pct(v) { return (v * 100).toFixed(0) + "%"; }

  function drawDiagnoses() {
    drawSeries("waits", function (s) {
      return [["rank " + s.rank + " report()", s.report_wait_s], ["rank " + s.rank + " collective", s.collective_wait_s]];
    }, { title: "", axis: "seconds per step", empty: "no wait measured yet",
         format: function (v) { return (v * 1000).toFixed(0) + " ms"; } });
    drawSeries("idle", function (s) {
      if (!isNumber(s.step_time_s) || s.step_time_s <= 0) { return []; }
      var waits = [s.data_wait_s, s.report_wait_s, s.collective_wait_s].filter(isNumber);
      var idle = waits.reduce(function (a, b) { return a + b; }, 0);
      return [["rank " + s.rank + " data wait", isNumber(s.data_wait_s) ? Math.min(s.data_wait_s / s.step_time_s, 1) : null],
              ["rank " + s.rank + " idle (all waits)", Math.min(idle / s.step_time_s, 1)]];
    }, { title: "", axis: "share of the step", empty: "no step measured yet", format: pct });
    drawSeries("memory", function (s) {
      return [["rank " + s.rank, toMib(s.rss_bytes)]];
    }, { round: true, title: "per rank", axis: "MiB", empty: "no memory measured yet", format: mib });
    // Per node: the sum of its ranks' RSS, against the host's total memory (its agent's figure).
    // The totals set the scale; a click on one's legend entry hides it and zooms in on the ranks.
    drawSeries("node-memory", function (s) {
      return [["node " + s.host + " (its ranks)", toMib(s.rss_bytes)]];
    }, { round: true, title: "per node, against the host's total", axis: "MiB", empty: "", format: mib,
         constants: nodes.map(function (n) {
           return ["node " + n.host + " total (" + (n.memory_bytes / 1073741824).toFixed(1) + " GiB)",
                   toMib(n.memory_bytes)];
         }) });
    drawSeries("gpu-util", function (s) {
      return (s.gpus || []).map(function (g) { return ["rank " + s.rank + " GPU " + g.index, g.util_percent]; });
    }, { title: "GPU utilisation", axis: "%", empty: "no GPU measured (no NVML or no GPU on the workers)",
         format: function (v) { return v.toFixed(0) + "%"; } });
    drawSeries("gpu-memory", function (s) {
      return (s.gpus || []).map(function (g) { return ["rank " + s.rank + " GPU " + g.index, toMib(g.memory_used_bytes)]; });
    }, { title: "GPU memory used", axis: "MiB", empty: "", format: mib });
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
