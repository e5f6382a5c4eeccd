// prioqueue dashboard: polls one JSON endpoint of the service that served this page.
// Everything from the server is put in the page with textContent (never innerHTML), so a
// member or model named "<script>" stays text. The key lives in sessionStorage only and is
// sent as an Authorization header, never in a URL or a cookie.

const root = document.documentElement;
const SERVICE = root.dataset.service;
const ENDPOINT = root.dataset.endpoint;
const POLL_MS = 2000;
const STORE = "prioqueue.dashboard.key";
const $ = (id) => document.getElementById(id);

let selectedJob = null;
let timer = null;
let busy = false;
let again = false;

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = String(value);
    else if (name === "onclick") node.addEventListener("click", value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// The dashboard's tables: [id, heading, caption, column headers, id of a line above the
// table]. tableSection draws one (its rows come from the render functions below).
const TABLES = [
  ["levels", "Levels", "Queue depth, waits and reorder causes per priority level",
    ["Level", "Queued", "Oldest wait", "p50 wait", "p95 wait", "Grants/min", "Reorder causes"],
    "totals"],
  ["lanes", "Lanes", "Each member's lane in each level: service received against the fair share",
    ["Level", "Member", "Queued", "Running", "Service vs fair share", "Jobs"]],
  ["gpus", "GPUs", "Workers and upstreams",
    ["GPU", "Resident model", "Running", "Prefetched", "State", "Recent swaps"]],
  ["films", "Films", "Groups: progress, GPU time and forecast finish",
    ["Film", "Member", "Progress", "GPU time", "Forecast finish", "Action"]],
];

function tableSection([id, heading, caption, columns, above]) {
  return el("section", { "aria-labelledby": `h-${id}` },
    el("h2", { id: `h-${id}`, text: heading }),
    above ? el("p", { id: above }) : null,
    el("table", { id },
      el("caption", { text: caption }),
      el("thead", {}, el("tr", {}, ...columns.map((name) => el("th", { scope: "col", text: name })))),
      el("tbody")));
}

// A duration as a person reads it: "4.2 s", "42 s", "14 min 5 s", "2 h 7 min". The value is
// rounded to the unit shown first and split after, so a part never reads 60 ("14 min 60 s"
// was 14 min 59.6 s) and a longer duration never reads shorter. A positive duration too
// short for a tenth reads "< 0.1 s", not "0.0 s".
function seconds(value) {
  if (value === null || value === undefined) return "–";
  const s = Math.max(0, Number(value));
  if (!Number.isFinite(s)) return "–";
  const tenths = Math.round(s * 10);
  if (tenths < 100) return tenths === 0 && s > 0 ? "< 0.1 s" : `${(tenths / 10).toFixed(1)} s`;
  const whole = Math.round(s);
  if (whole < 60) return `${whole} s`;
  if (whole < 3600) return `${Math.floor(whole / 60)} min ${whole % 60} s`;
  const minutes = Math.round(s / 60);
  return `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

// A level as the policy names it ("interactive (100)"), or its number where no alias names it.
let levelNames = {};
function levelName(level) {
  const name = levelNames[String(level)];
  return name === undefined ? String(level) : `${name} (${level})`;
}

function bar(fraction, label, kind = "") {
  const f = Math.max(0, Math.min(1, Number(fraction) || 0));
  const fill = el("span", { class: `fill ${kind}` });
  fill.style.width = `${(f * 100).toFixed(1)}%`;
  return el("span", { class: "bar", role: "img", "aria-label": label }, fill);
}

function key() {
  return sessionStorage.getItem(STORE);
}

function banner(text, kind = "") {
  const b = $("banner");
  b.textContent = text;
  b.className = kind;
}

function showLogin(message) {
  $("dashboard").hidden = true;
  $("login").hidden = false;
  $("forget").hidden = true;
  $("who").textContent = "";
  banner(message || "", message ? "error" : "");
  $("key").focus();
}

function jobButton(job) {
  if (!job) return el("span", { text: "–" });
  if (job.hidden) return el("span", { class: "hidden-job", text: "another member's job" });
  const label = [job.id, job.model ? `(${job.model})` : ""].join(" ").trim();
  return el("button", {
    type: "button", class: "job", "data-job": job.id, text: label,
    "aria-label": `Explain job ${job.id}`, onclick: () => openJob(job.id),
  });
}

function replaceRows(table, rows, empty) {
  const body = $(table).tBodies[0];
  const cols = $(table).tHead.rows[0].cells.length;
  body.replaceChildren(...(rows.length ? rows
    : [el("tr", {}, el("td", { colspan: cols, class: "empty", text: empty }))]));
}

function renderLevels(data) {
  $("totals").textContent = `${data.queued} queued, ${data.running} running`;
  const rows = data.levels.map((level) => {
    const causes = Object.entries(level.reorders || {});
    const most = Math.max(1, ...causes.map(([, n]) => n));
    const list = el("ul", { class: "causes" }, ...causes.map(([cause, n]) =>
      el("li", { "data-cause": cause },
        el("span", { class: "cause", text: cause.replaceAll("_", " ") }),
        bar(n / most, `${cause}: ${n}`), el("span", { class: "num", text: n }))));
    const q = (v) => (v === null ? "–" : `≤ ${seconds(v)}${level.wait_open ? "+" : ""}`);
    return el("tr", { "data-level": level.level },
      el("th", { scope: "row", text: levelName(level.level) }),
      el("td", { text: level.queued }),
      el("td", { text: seconds(level.oldest_wait) }),
      el("td", { text: q(level.wait_p50) }),
      el("td", { text: q(level.wait_p95) }),
      el("td", { text: level.grants_per_minute === null ? "–" : level.grants_per_minute }),
      el("td", {}, list));
  });
  replaceRows("levels", rows, "No level has seen a job yet.");
}

function renderLanes(data) {
  const rows = data.lanes.map((lane) => {
    const service = lane.service === null ? 0 : lane.service;
    const label = `service ${(service * 100).toFixed(0)}% against a fair share of ${(lane.fair_share * 100).toFixed(0)}%`;
    const share = el("div", { class: "share" },
      bar(service, label, service + 1e-9 < lane.fair_share ? "under" : "over"),
      el("span", { class: "num", text: `${(service * 100).toFixed(0)}% / ${(lane.fair_share * 100).toFixed(0)}%` }));
    const jobs = el("ul", { class: "jobs" }, ...lane.jobs.map((job) => el("li", {}, jobButton(job))));
    return el("tr", { "data-member": lane.member, "data-level": lane.level },
      el("td", { text: levelName(lane.level) }),
      el("th", { scope: "row", class: "member", text: lane.member }),
      el("td", { text: lane.queued }),
      el("td", { text: lane.running }),
      el("td", {}, share),
      el("td", {}, jobs));
  });
  replaceRows("lanes", rows, data.scope === "worker" ? "A worker key sees no lanes." : "No lane has work.");
}

function renderGpus(data) {
  // The swaps timeline: the last window_seconds, now at the right edge.
  const rows = data.workers.map((w) => {
    const flags = [];
    if (w.unhealthy) flags.push("unhealthy");
    if (w.timed_out) flags.push("timed out");
    if (w.slow) flags.push("slow");
    const running = w.running
      ? el("div", {}, jobButton(w.running),
          w.running.lease_remaining === undefined || w.running.lease_remaining === null ? null
            : el("span", { class: "lease", text: ` lease ${seconds(w.running.lease_remaining)} left` }))
      : el("span", { text: "idle" });
    const span = (data.limits && data.limits.window_seconds) || 600;
    const strip = el("div", { class: "timeline", role: "img",
      "aria-label": `${w.swaps.length} swaps of ${w.name} in the last ${seconds(span)}` });
    for (const s of w.swaps) {
      const mark = el("span", { class: "mark", title: `${s.to} ${seconds(s.ago)} ago` });
      mark.style.left = `${Math.max(0, 100 - (100 * s.ago) / span).toFixed(1)}%`;
      strip.append(mark);
    }
    const swaps = el("div", {}, strip,
      el("ol", { class: "swaps", "aria-label": `recent swaps of ${w.name}` },
        ...w.swaps.map((s) => el("li", { text: `${s.to} ${seconds(s.ago)} ago` }))));
    return el("tr", { "data-worker": w.name },
      el("th", { scope: "row", text: w.name }),
      el("td", { text: w.resident === null ? "–" : w.resident }),
      el("td", {}, running),
      el("td", {}, el("ul", { class: "jobs" }, ...w.prefetched.map((j) => el("li", {}, jobButton(j))))),
      el("td", { class: flags.length ? "warn" : "", text: flags.length ? flags.join(", ") : "ok" }),
      el("td", {}, swaps));
  });
  replaceRows("gpus", rows, "No worker has joined yet.");
}

async function cancelFilm(group, member, button) {
  button.disabled = true;
  const prefix = SERVICE === "gateway" ? "/prioqueue/groups/" : "/v1/groups/";
  const query = new URLSearchParams({ member, running: "cancel" });
  try {
    const response = await fetch(`${prefix}${encodeURIComponent(group)}?${query}`, {
      method: "DELETE", headers: { Authorization: `Bearer ${key()}` }, cache: "no-store",
    });
    banner(response.ok ? `Film ${group} cancelled.` : `Cancel refused: ${response.status}`,
      response.ok ? "" : "error");
  } catch (error) {
    banner(`Cancel failed: ${error}`, "error");
  }
  poll();
}

function renderFilms(data) {
  const rows = data.groups.map((g) => {
    const total = g.done + g.running + g.queued + g.failed + g.cancelled || 1;
    const progress = el("div", { class: "progress", role: "img",
      "aria-label": `${g.done} done, ${g.running} running, ${g.queued} queued, ${g.failed} failed` });
    for (const part of ["done", "running", "queued", "failed", "cancelled"]) {
      const seg = el("span", { class: `seg ${part}` });
      seg.style.width = `${((g[part] / total) * 100).toFixed(1)}%`;
      progress.append(seg);
    }
    const counts = el("span", { class: "counts",
      text: `${g.done} done · ${g.running} running · ${g.queued} queued · ${g.failed} failed` });
    let forecast = "–";
    if (g.forecast_in !== null) forecast = `in ${seconds(g.forecast_in)}`;
    else if (g.forecast_beyond) forecast = "beyond the forecast horizon";
    else if (g.queued + g.running === 0) forecast = "finished";
    const action = g.can_cancel
      ? el("button", { type: "button", class: "cancel", text: `Cancel ${g.group}`,
          "aria-label": `Cancel film ${g.group} of ${g.member}` })
      : el("span", { text: "–" });
    if (g.can_cancel) action.addEventListener("click", () => cancelFilm(g.group, g.member, action));
    return el("tr", { "data-group": g.group, "data-member": g.member },
      el("th", { scope: "row", text: g.group }),
      el("td", { text: g.member }),
      el("td", {}, progress, counts),
      el("td", { class: "gpu", text: seconds(g.gpu_seconds) }),
      el("td", { class: "forecast", text: forecast }),
      el("td", {}, action));
  });
  replaceRows("films", rows, data.scope === "worker" ? "A worker key sees no films." : "No film yet.");
}

function dl(pairs) {
  const list = el("dl");
  for (const [name, value] of pairs) list.append(el("dt", { text: name }), el("dd", { text: value }));
  return list;
}

function renderJob(data) {
  const box = $("job");
  const job = data.job;
  if (!selectedJob || !job) {
    box.replaceChildren();
    return;
  }
  if (job.error) {
    box.replaceChildren(el("p", { class: "error", text: job.error }));
    return;
  }
  const parts = [el("h3", { text: `Job ${job.id}` }), dl([
    ["State", job.state], ["Member", job.member ?? "–"], ["Priority", job.priority === null || job.priority === undefined ? "–" : levelName(job.priority)],
    ["Model", job.model ?? "–"], ["Film", job.group ?? "–"], ["Worker", job.worker ?? "–"],
    ["Labels", job.labels ? Object.entries(job.labels).map(([k, v]) => `${k}=${v}`).join(", ") || "–" : "–"],
    ["Lease left", seconds(job.lease_remaining)],
  ])];
  const ex = job.explain;
  if (ex) {
    parts.push(el("h4", { text: "Why here" }), dl([
      ["Position", ex.state === "running" ? "running" : `${ex.position}${ex.ahead_complete ? "" : "+"}`],
      ["Waited", seconds(ex.waited)],
      ["Forecast start", ex.state === "running" ? "started" : ex.forecast_start_in === null ? "unknown" : `in ${seconds(ex.forecast_start_in)}`],
    ]));
    const score = el("table", { class: "score" },
      el("caption", { text: "Score terms" }),
      el("thead", {}, el("tr", {}, el("th", { scope: "col", text: "Term" }), el("th", { scope: "col", text: "Points" }))),
      el("tbody", {}, ...Object.entries(ex.score).map(([term, v]) =>
        el("tr", {}, el("th", { scope: "row", text: term.replaceAll("_", " ") }), el("td", { text: v })))));
    parts.push(score);
    const who = (o) => (o.hidden ? "another member's job" : `${o.id} (${o.member})`);
    parts.push(el("h4", { text: `Ahead (${ex.ahead.length})` }),
      el("ol", { class: "ahead" }, ...ex.ahead.map((a) => el("li", {},
        a.hidden ? who(a) : jobButton({ id: a.id, model: null }),
        ` level ${levelName(a.priority)}, score ${a.score}${a.start_in === null ? "" : `, starts in ${seconds(a.start_in)}`}`))));
    parts.push(el("h4", { text: `Overtaken by (${ex.overtaken_by.length})` }),
      el("ol", { class: "overtakes" }, ...ex.overtaken_by.map((o) => el("li", {
        text: `${who(o)}: level ${levelName(o.priority)}, by ${o.cause.replaceAll("_", " ")} (margin ${o.margin}), ${seconds(o.ago)} ago` }))));
  }
  box.replaceChildren(...parts);
}

function render(data) {
  const who = data.role === "worker" ? "worker key"
    : `${data.member} (${data.scope === "all" ? (data.admin ? "admin" : "observer") : "submitter"})`;
  $("who").textContent = `Signed in as ${who}`;
  $("job-section").hidden = data.role === "worker";
  levelNames = data.level_names || {};
  renderLevels(data);
  renderLanes(data);
  renderGpus(data);
  renderFilms(data);
  renderJob(data);
}

async function poll() {
  clearTimeout(timer);
  timer = null;
  if (!key()) return showLogin();
  if (busy) {
    again = true; // a click or a search while a poll is in flight: poll once more after it
    return;
  }
  busy = true;
  again = false;
  let url = ENDPOINT;
  if (selectedJob) url += `?${new URLSearchParams({ job: selectedJob })}`;
  try {
    const response = await fetch(url, {
      headers: { Authorization: `Bearer ${key()}`, Accept: "application/json" }, cache: "no-store",
    });
    if (response.status === 401) {
      sessionStorage.removeItem(STORE);
      showLogin("That key was refused (401). Type another.");
      return;
    }
    if (!response.ok) throw new Error(`${SERVICE} answered ${response.status}`);
    const data = await response.json();
    $("login").hidden = true;
    $("dashboard").hidden = false;
    $("forget").hidden = false;
    if ($("banner").className === "error" && !$("banner").textContent.startsWith("Cancel")) banner("");
    render(data);
    root.dataset.updated = String(Date.now());
  } catch (error) {
    banner(`The ${SERVICE} is unreachable (${error.message}); retrying every ${POLL_MS / 1000} s.`, "error");
  } finally {
    busy = false;
    if (key()) timer = setTimeout(poll, again ? 0 : POLL_MS);
  }
}

function openJob(id) {
  selectedJob = id;
  $("job-id").value = id;
  poll();
}

$("job-section").before(...TABLES.map(tableSection));
$("login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(STORE, $("key").value.trim());
  $("key").value = "";
  banner("");
  poll();
});
$("forget").addEventListener("click", () => {
  sessionStorage.removeItem(STORE);
  clearTimeout(timer);
  showLogin();
});
$("search").addEventListener("submit", (event) => {
  event.preventDefault();
  const id = $("job-id").value.trim();
  selectedJob = id || null;
  poll();
});

// The page's formatter of durations, for tests/ui (a module's functions are not global).
window.prioqueueSeconds = seconds;

poll();
