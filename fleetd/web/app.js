// fleetd status page: reads /api/v1 with the bearer token and redraws every 10 s.
// Plain ES2020, no libraries, nothing fetched from anywhere but this daemon.
// Every server-provided string reaches the DOM through textContent or setAttribute, never as markup.
'use strict';

(() => {
  const REFRESH_MS = 10000;
  const TOKEN_KEY = 'fleetd.token';
  const SVG_NS = 'http://www.w3.org/2000/svg'; // an XML namespace name, not something fetched
  const DAY_MS = 86400000;
  const GAMES_PAGE = 100; // GET /games's default page; the table shows one page at a time
  const PLOTTED_GAMES = 12; // plots for the first games of the page only: two series each
  const EVENTS_SHOWN = 20; // the events panel: the newest of the log (`fleetd events` pages through all)
  const STATES = ['stopped', 'pending', 'starting', 'running', 'backoff', 'stopping', 'exited', 'fatal']; // fleetd/states.py Shown

  const $ = (id) => document.getElementById(id);

  // ---------------------------------------------------------------- the token

  class AuthError extends Error {}

  let memoryToken = ''; // when session storage is unavailable (some private modes)

  function readToken() {
    try {
      return sessionStorage.getItem(TOKEN_KEY) || '';
    } catch (_) {
      return memoryToken;
    }
  }

  function storeToken(token) {
    memoryToken = token;
    try {
      if (token) sessionStorage.setItem(TOKEN_KEY, token);
      else sessionStorage.removeItem(TOKEN_KEY);
    } catch (_) { /* memoryToken holds it for this page's life */ }
  }

  // `#token=...` is read once, kept in session storage, and taken out of the address bar
  // (and so out of the history and of anything copied from it). The fragment never reaches the server.
  function takeTokenFromFragment() {
    const fragment = location.hash.replace(/^#/, '');
    if (!fragment) return false;
    let token = null;
    const rest = [];
    for (const part of fragment.split('&')) {
      if (part.startsWith('token=')) {
        try {
          token = decodeURIComponent(part.slice('token='.length)).trim();
        } catch (_) {
          token = part.slice('token='.length).trim();
        }
      } else if (part) {
        rest.push(part);
      }
    }
    if (token === null) return false;
    history.replaceState(null, '', location.pathname + location.search + (rest.length ? '#' + rest.join('&') : ''));
    if (token) storeToken(token);
    return Boolean(token);
  }

  // ---------------------------------------------------------------- the API

  async function api(path, { optional = false, text = false } = {}) {
    const token = readToken();
    if (!token) throw new AuthError('');
    let response;
    try {
      response = await fetch('/api/v1' + path, {
        headers: { Authorization: 'Bearer ' + token, Accept: text ? 'text/plain' : 'application/json' },
        cache: 'no-store',
        credentials: 'omit',
      });
    } catch (error) {
      throw new Error('cannot reach fleetd (' + error.message + ')');
    }
    if (response.status === 401) throw new AuthError('The daemon refused this token.');
    if (optional && response.status === 404) return null;
    if (text && response.ok) return response.text();
    let body = null;
    try {
      body = await response.json();
    } catch (_) { /* not JSON: described below */ }
    if (!response.ok) {
      const message = body && body.error && body.error.message ? body.error.message : response.statusText;
      const error = new Error(path + ': ' + response.status + ' ' + message);
      error.status = response.status;
      error.details = (body && body.error && body.error.details) || {};
      throw error;
    }
    return body;
  }

  function samples(query) {
    return api('/samples?' + new URLSearchParams(query).toString())
      .then((series) => series.points || [])
      .catch((error) => {
        if (error instanceof AuthError) throw error;
        return { error: error.message };
      });
  }

  // Each series is loaded whole once (the last 24 h, newest SAMPLE_LIMIT points), then only the
  // points after its newest one; a full reload now and then picks up anything rewritten.
  const SAMPLE_LIMIT = 5000;
  const FULL_RELOAD_EVERY = 30; // refreshes: 5 minutes
  const seriesCache = new Map();
  const seriesUsed = new Set();

  // A game's rollbacks for its eval plot's dashed lines: the learning-health rule's and the
  // operator's (`fleetd games rollback`, event kind `rollback`); the page drew the rule's only.
  // Events name their game, not its id: those since the game's creation are this game's, not
  // those of a removed game whose name it took again.
  async function rollbackEvents(game) {
    const answers = await Promise.all(['learning_rollback', 'rollback'].map((kind) =>
      api('/events?' + new URLSearchParams({ game: game.name, kind, since: game.created_at, limit: '50' }), { optional: true })));
    return { items: answers.flatMap((answer) => (answer && answer.items) || []) };
  }

  // The newest events, as `fleetd events` lists them. A failed read is the events panel's to
  // say: the rest of the page is drawn as it would be without it.
  function recentEvents() {
    return api('/events?' + new URLSearchParams({ limit: String(EVENTS_SHOWN) })).catch((error) => {
      if (error instanceof AuthError) throw error;
      return { error: error.message };
    });
  }

  async function series(query) {
    const key = new URLSearchParams(query).toString();
    seriesUsed.add(key);
    const cached = seriesCache.get(key);
    if (cached && cached.lastAt && cached.refreshes < FULL_RELOAD_EVERY) {
      const fresh = await samples({ ...query, since: cached.lastAt });
      if (fresh.error) return fresh;
      const newer = fresh.filter((p) => toMs(p.at) > cached.lastMs);
      if (newer.length) {
        const last = newer[newer.length - 1];
        cached.lastAt = last.at;
        cached.lastMs = toMs(last.at);
        const cutoff = cached.lastMs - DAY_MS;
        cached.points = cached.points.concat(newer).filter((p) => toMs(p.at) >= cutoff).slice(-SAMPLE_LIMIT);
      }
      cached.refreshes += 1;
      return cached.points;
    }
    const points = await samples({ ...query, limit: String(SAMPLE_LIMIT) });
    if (points.error) return points;
    const last = points[points.length - 1];
    seriesCache.set(key, { points, lastAt: last ? last.at : null, lastMs: last ? toMs(last.at) : NaN, refreshes: 0 });
    return points;
  }

  function forgetUnusedSeries() {
    for (const key of seriesCache.keys()) if (!seriesUsed.has(key)) seriesCache.delete(key);
    seriesUsed.clear();
  }

  // ---------------------------------------------------------------- DOM helpers

  function add(parent, kids) {
    for (const kid of kids) {
      if (kid === null || kid === undefined || kid === false) continue;
      if (Array.isArray(kid)) add(parent, kid);
      else parent.appendChild(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return parent;
  }

  function setAttrs(node, attrs) {
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === 'class') node.setAttribute('class', value);
      else if (key === 'text') node.textContent = String(value);
      else node.setAttribute(key, value === true ? '' : String(value));
    }
    return node;
  }

  const h = (tag, attrs, ...kids) => add(setAttrs(document.createElement(tag), attrs), kids);
  const svg = (tag, attrs, ...kids) => add(setAttrs(document.createElementNS(SVG_NS, tag), attrs), kids);

  // ---------------------------------------------------------------- formatting

  const DASH = '—';
  const isNum = (v) => typeof v === 'number' && Number.isFinite(v);
  const pad = (n) => String(n).padStart(2, '0');

  function fmtInt(v) {
    return isNum(v) ? Math.round(v).toLocaleString('en-US') : DASH;
  }

  function fmtNum(v, digits = 1) {
    if (!isNum(v)) return DASH;
    return v.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits });
  }

  // Each unit is chosen after rounding to it: 999,999 is 1.00M, not 1000.0k.
  function fmtCompact(v) {
    if (!isNum(v)) return DASH;
    const rounded = (scale, digits) => Math.abs(Number((v / scale).toFixed(digits)));
    if (rounded(1e6, 2) >= 1000) return (v / 1e9).toFixed(2) + 'G';
    if (rounded(1e3, 1) >= 1000) return (v / 1e6).toFixed(2) + 'M';
    if (rounded(1, 0) >= 1e4) return (v / 1e3).toFixed(1) + 'k';
    if (rounded(1, 1) >= 100 || Number.isInteger(v)) return String(Math.round(v));
    return v.toFixed(rounded(1, 2) >= 10 ? 1 : 2);
  }

  // Rounded to the last unit shown, then split (as fleetd/durations.py does): 7185 s is 2 h 0 min, not 1 h 60 min.
  function fmtDuration(seconds) {
    if (!isNum(seconds)) return DASH;
    const s = Math.max(0, Math.round(seconds));
    if (s < 90) return s + ' s';
    const m = Math.round(s / 60);
    if (m < 90) return m + ' min';
    if (Math.floor(m / 60) < 48) return Math.floor(m / 60) + ' h ' + (m % 60) + ' min';
    const hours = Math.round(s / 3600);
    return Math.floor(hours / 24) + ' d ' + (hours % 24) + ' h';
  }

  // Each unit after rounding to it, as fmtCompact: 59.9 min is 1.0 h, not 60 min; 47.96 h is 2.0 d.
  function fmtHours(hours) {
    if (!isNum(hours)) return DASH;
    const minutes = Math.round(hours * 60);
    if (minutes < 60) return minutes + ' min';
    if (Number(hours.toFixed(1)) < 48) return hours.toFixed(1) + ' h';
    return (hours / 24).toFixed(1) + ' d';
  }

  // A reading that is a percent already (0-100); none: a dash alone, not "—%".
  function fmtPercent(v, digits = 0) {
    return isNum(v) ? v.toFixed(digits) + '%' : DASH;
  }

  function fmtPct(fraction, digits = 2) {
    return isNum(fraction) ? (fraction * 100).toFixed(digits) + '%' : DASH;
  }

  // The host's share of memory available; null where either reading is missing or was nonsense.
  function hostAvailable(host) {
    return isNum(host.memory_total_bytes) && host.memory_total_bytes > 0 && isNum(host.memory_available_bytes)
      ? host.memory_available_bytes / host.memory_total_bytes : null;
  }

  // A worker's GPU memory: its reading, or, where NVML cannot tell (process_gpu_reason), an
  // estimate marked as one, never shown as a reading: its GPU's memory not held by the workers
  // measured there, shared by the unknown ones placed on it. Else a dash.
  function gpuMemText(p) {
    if (isNum(p.gpu_memory_bytes)) return fmtBytes(p.gpu_memory_bytes);
    if (isNum(p.gpu_memory_estimate_bytes)) return '~' + fmtBytes(p.gpu_memory_estimate_bytes) + ' est.';
    return DASH;
  }

  function fmtBytes(bytes) {
    if (!isNum(bytes)) return DASH;
    const mib = Math.round(bytes / 2 ** 20); // 1023.6 MiB is 1.0 GiB, not 1024 MiB
    return Math.abs(mib) >= 1024 ? (bytes / 2 ** 30).toFixed(1) + ' GiB' : mib + ' MiB';
  }

  // [costs] currency is a symbol ("$", "€") or an ISO code ("EUR").
  function fmtMoney(value, currency) {
    if (!isNum(value)) return DASH;
    const unit = String(currency || '');
    if (/^[A-Z]{3}$/.test(unit)) {
      try {
        return new Intl.NumberFormat('en-US', { style: 'currency', currency: unit }).format(value);
      } catch (_) { /* an unknown code: written out below */ }
      return value.toLocaleString('en-US', { minimumFractionDigits: 2, maximumFractionDigits: 2 }) + ' ' + unit;
    }
    const amount = Math.abs(value).toLocaleString('en-US', { minimumFractionDigits: 2, maximumFractionDigits: 2 });
    return (value < 0 ? '-' : '') + unit + amount;
  }

  const toMs = (iso) => (iso ? Date.parse(iso) : NaN);

  function fmtTime(iso, { seconds = false } = {}) {
    const ms = typeof iso === 'number' ? iso : toMs(iso);
    if (!Number.isFinite(ms)) return DASH;
    const d = new Date(ms);
    const time = pad(d.getHours()) + ':' + pad(d.getMinutes()) + (seconds ? ':' + pad(d.getSeconds()) : '');
    return d.getFullYear() + '-' + pad(d.getMonth() + 1) + '-' + pad(d.getDate()) + ' ' + time;
  }

  function fmtClock(ms) {
    const d = new Date(ms);
    return pad(d.getHours()) + ':' + pad(d.getMinutes());
  }

  function fmtRelative(iso, nowMs) {
    const ms = toMs(iso);
    if (!Number.isFinite(ms)) return DASH;
    const delta = (ms - nowMs) / 1000;
    return delta >= 0 ? 'in ' + fmtDuration(delta) : fmtDuration(-delta) + ' ago';
  }

  const stateClass = (state) => 'state state-' + (STATES.includes(state) ? state : 'other');

  // ---------------------------------------------------------------- plots

  const PLOT = { w: 340, h: 130, left: 52, right: 10, top: 10, bottom: 22 };

  // At most ~2 points per pixel column: min and max of each bucket, so spikes survive.
  function thin(points, buckets) {
    if (points.length <= buckets * 2) return points;
    const t0 = points[0][0];
    const span = points[points.length - 1][0] - t0 || 1;
    const out = [];
    let bucket = -1;
    let lo = null;
    let hi = null;
    const flush = () => {
      if (!lo) return;
      if (lo === hi) out.push(lo);
      else if (lo[0] <= hi[0]) out.push(lo, hi);
      else out.push(hi, lo);
    };
    for (const p of points) {
      const b = Math.min(buckets - 1, Math.floor(((p[0] - t0) / span) * buckets));
      if (b !== bucket) {
        flush();
        bucket = b;
        lo = hi = p;
      } else {
        if (p[1] < lo[1]) lo = p;
        if (p[1] > hi[1]) hi = p;
      }
    }
    flush();
    return out;
  }

  function median(values) {
    if (!values.length) return 0;
    const sorted = [...values].sort((a, b) => a - b);
    return sorted[Math.floor(sorted.length / 2)];
  }

  // Axis ticks at round values: steps of 1, 2 or 5 times a power of ten, about `target` of
  // them, covering [lo, hi] (the axis is widened to the outer ticks).
  function niceTicks(lo, hi, target = 4) {
    const raw = (hi - lo) / Math.max(1, target);
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw * (1 - 1e-9));
    const first = Math.floor(lo / step + 1e-9) * step;
    const ticks = [];
    for (let v = first; v < hi + step * (1 - 1e-9); v += step) ticks.push(Number(v.toPrecision(12)));
    if (ticks[ticks.length - 1] < hi) ticks.push(Number((ticks[ticks.length - 1] + step).toPrecision(12)));
    return ticks;
  }

  // A line plot of one metric over time; breaks the line where samples stopped (daemon or host down).
  function linePlot(raw, { label, format = fmtCompact, kind = 'line', key = '', marks = null }) {
    const figure = h('figure', { class: 'plot-box' });
    const caption = h('figcaption', null, h('span', { class: 'plot-label' }, label));
    figure.appendChild(caption);
    if (raw && raw.error) {
      figure.appendChild(h('div', { class: 'plot-empty' }, 'samples unavailable: ' + raw.error));
      return figure;
    }
    const points = (raw || [])
      .map((p) => [toMs(p.at), p.value])
      .filter((p) => Number.isFinite(p[0]) && isNum(p[1]));
    if (!points.length) {
      figure.appendChild(h('div', { class: 'plot-empty', 'data-plot': key }, 'no samples yet'));
      return figure;
    }
    const last = points[points.length - 1];
    caption.appendChild(h('span', { class: 'plot-value num' }, format(last[1])));

    const { w, h: height, left, right, top, bottom } = PLOT;
    const innerW = w - left - right;
    const innerH = height - top - bottom;
    const thinned = thin(points, innerW);
    let t0 = points[0][0];
    let t1 = last[0];
    if (t1 - t0 < 60000) t0 = t1 - 60000; // a fresh series: at least a minute wide
    let v0 = Math.min(...thinned.map((p) => p[1]));
    let v1 = Math.max(...thinned.map((p) => p[1]));
    if (v1 - v0 < 1e-9) {
      const padding = Math.abs(v1) * 0.05 || 1;
      v0 -= padding;
      v1 += padding;
    } else {
      const padding = (v1 - v0) * 0.06;
      v1 += padding;
      v0 = v0 >= 0 && v0 - padding < 0 ? 0 : v0 - padding;
    }
    const ticks = niceTicks(v0, v1);
    v0 = ticks[0];
    v1 = ticks[ticks.length - 1];
    const x = (t) => left + ((t - t0) / (t1 - t0)) * innerW;
    const y = (v) => top + innerH - ((v - v0) / (v1 - v0)) * innerH;

    const gaps = [];
    for (let i = 1; i < points.length; i++) gaps.push(points[i][0] - points[i - 1][0]);
    const gapMs = Math.max(90000, 10 * median(gaps));

    const segments = []; // the runs of samples between gaps
    let previous = null;
    for (const p of thinned) {
      if (previous === null || p[0] - previous[0] > gapMs) segments.push([]);
      segments[segments.length - 1].push(p);
      previous = p;
    }
    const xy = (p) => x(p[0]).toFixed(1) + ' ' + y(p[1]).toFixed(1);
    const d = segments.map((run) => 'M' + run.map(xy).join('L')).join('');

    const chart = svg('svg', {
      class: 'plot plot-' + kind,
      viewBox: '0 0 ' + w + ' ' + height,
      role: 'img',
      'aria-label': label,
      'data-plot': key,
      'data-points': points.length,
    });
    const grid = svg('g', { class: 'axis' });
    for (const v of ticks) {
      const gy = y(v).toFixed(1);
      grid.appendChild(svg('line', { x1: left, x2: w - right, y1: gy, y2: gy }));
      grid.appendChild(svg('text', { x: left - 6, y: Number(gy) + 3.5, 'text-anchor': 'end' }, format(v)));
    }
    grid.appendChild(svg('text', { x: left, y: height - 6, 'text-anchor': 'start' }, fmtClock(t0)));
    grid.appendChild(svg('text', { x: w - right, y: height - 6, 'text-anchor': 'end' }, fmtClock(t1)));
    chart.appendChild(grid);
    if (kind === 'area' && points.length > 1) { // each run filled down to the axis on its own: none across a gap
      const base = (p) => 'L' + x(p[0]).toFixed(1) + ' ' + (top + innerH);
      chart.appendChild(svg('path', { class: 'area', d: segments.map((run) => 'M' + run.map(xy).join('L') + base(run[run.length - 1]) + base(run[0]) + 'Z').join('') }));
    }
    chart.appendChild(svg('path', { class: 'line', d }));
    if (marks) markPlot(chart, points, marks, { x, y, t0, t1, top, innerH, format });
    chart.appendChild(svg('circle', { class: 'dot', cx: x(last[0]).toFixed(1), cy: y(last[1]).toFixed(1), r: 2.5 },
      svg('title', null, format(last[1]) + ' at ' + fmtTime(last[0], { seconds: true }))));
    figure.appendChild(chart);
    return figure;
  }

  // Learning health on the eval plot: a ring on the best evaluation, a dashed line at each
  // rollback to the best-evaluated checkpoint (docs/learning-health.md).
  function markPlot(chart, points, marks, { x, y, t0, t1, top, innerH, format }) {
    // The first sample at the best: when it was reached. None when that was before this plot's
    // 24 h: a ring on the nearest value would call another evaluation the best.
    const best = isNum(marks.best) ? points.find((p) => Math.abs(p[1] - marks.best) <= 1e-9 * Math.max(1, Math.abs(marks.best))) : null;
    if (best) {
      chart.appendChild(svg('circle', { class: 'best', cx: x(best[0]).toFixed(1), cy: y(best[1]).toFixed(1), r: 4.5, 'data-mark': 'best' },
        svg('title', null, 'best evaluation ' + format(marks.best) + (isNum(marks.bestSteps) ? ' at ' + fmtInt(marks.bestSteps) + ' steps' : ''))));
    }
    for (const event of marks.rollbacks || []) {
      const t = toMs(event.at);
      if (!(t >= t0 && t <= t1)) continue;
      const gx = x(t).toFixed(1);
      chart.appendChild(svg('line', { class: 'rollback', x1: gx, x2: gx, y1: top, y2: top + innerH, 'data-mark': 'rollback' },
        svg('title', null, 'rollback at ' + fmtTime(event.at, { seconds: true }) + ': ' + event.message)));
    }
  }

  function healthCell(g) {
    if (!g.health) return h('td', null, DASH);
    const text = g.health + (g.rollbacks ? ' (' + g.rollbacks + '×)' : '');
    return h('td', null, h('span', { class: 'health-' + g.health, title: g.health_reason || '' }, text));
  }

  // ---------------------------------------------------------------- panels

  function fact(list, term, ...value) {
    list.appendChild(h('dt', null, term));
    list.appendChild(h('dd', null, ...value));
  }

  // What the operator asked, when it is a tier other than the fleet's ("auto" asks for none), as the CLI's tier_text.
  function tierAsked(fleet) {
    const requested = fleet.requested;
    return requested && requested !== 'auto' && requested !== fleet.tier ? ' (asked: ' + requested + ')' : null;
  }

  // One expected reboot, as `fleetd tier` says it: `#3 until 2026-11-26 14:00 (holds): kernel update; explained 0 of 1 reboot`.
  // GET /fleet lists only the expected reboots that hold now: `fleetd tier`'s line for one (fleetd/cli/render.py).
  function expectedReboot(word) {
    return '#' + word.id + ' until ' + fmtTime(word.until) + ' (holds): ' + word.reason + '; explained ' +
      word.explained + ' of ' + word.reboots + (word.reboots === 1 ? ' reboot' : ' reboots');
  }

  function renderFleet(fleet, nowMs) {
    const list = $('fleet');
    list.replaceChildren();
    if (fleet.error) {
      list.appendChild(h('p', { class: 'notice' }, 'fleet unavailable: ' + fleet.error));
      return;
    }
    fact(list, 'tier', h('strong', null, fleet.tier), ' · ', fleet.mode, tierAsked(fleet));
    // When the supervisor loop published all this: a stuck loop's last view is said to be old, not shown as now.
    if (fleet.snapshot_at) {
      fact(list, 'as of', h('span', { class: 'num', title: fmtDuration(fleet.snapshot_age_s) + ' ago' }, fmtTime(fleet.snapshot_at, { seconds: true })),
        fleet.snapshot_stale ? h('span', { class: 'warn', 'data-stale': '' }, ' · ' + fmtDuration(fleet.snapshot_age_s) +
          ' ago: stale, the supervisor loop is stuck; the governor\u2019s figures are its last view') : null);
    }
    fact(list, 'rung', h('span', { class: 'num' }, fleet.rung || DASH)); // its label, as the ceiling's and `fleetd tier`'s
    fact(list, 'games allowed', h('span', { class: 'num' }, String(fleet.allowed)),
      ' · level ', h('span', { class: 'num' }, String(fleet.level)),
      // The rung above, held back while it waits out a failure (a label, as `fleetd fleet` shows it).
      fleet.ceiling ? h('span', { class: 'warn' }, ' · waiting out a failure: ' + fleet.ceiling +
        (fleet.ceiling_until ? ' until ' + fmtTime(fleet.ceiling_until) : '')) : null);
    fact(list, 'admitted', h('span', { class: 'num' }, String((fleet.admitted || []).length)), ' ',
      h('span', { class: 'muted' }, (fleet.admitted || []).join(', ')));
    fact(list, 'pending', h('span', { class: 'num' }, String((fleet.pending || []).length)), ' ',
      h('span', { class: 'muted' }, (fleet.pending || []).join(', ')));
    fact(list, 'next scale-up', fleet.next_scale_up_at
      ? h('span', { class: 'num', title: fmtTime(fleet.next_scale_up_at, { seconds: true }) },
        fmtRelative(fleet.next_scale_up_at, nowMs) + ' (' + fmtTime(fleet.next_scale_up_at) + ')')
      : DASH);
    fact(list, 'waiting', fleet.waiting_reason || DASH);
    // What the governor holds back or backs off on, and its last back-off: as `fleetd tier` shows them.
    const pressure = fleet.pressure || [];
    fact(list, 'pressure', pressure.length ? h('span', { class: 'warn' }, pressure.join('; ')) : h('span', { class: 'muted' }, 'none'));
    fact(list, 'last back-off', fleet.last_backoff || DASH);
    // The operator's word that the host will go down (`fleetd reboots expect`): a reboot then is not the load's.
    const expected = fleet.expected_reboots || [];
    if (expected.length) fact(list, 'reboot expected', expected.map((word) => h('div', null, expectedReboot(word))));
    if (fleet.settings) {
      fact(list, 'per game', h('span', { class: 'num' }, fleet.settings.num_envs + ' envs · batch ' + fleet.settings.batch_size),
        h('div', { class: 'muted small' }, fleet.settings.reason || ''));
    }
  }

  function etaCell(projection) {
    if (!projection) return h('td', { class: 'r num muted' }, DASH);
    // Wants no slot (stopped, given up, ended): not planned, so not stalled; named by its state, as `fleetd plan` does.
    if (projection.plan_state === 'off') return h('td', { class: 'r muted', title: 'not planned: it wants no slot' }, projection.state);
    if (!projection.goal) return h('td', { class: 'r muted' }, 'no goal');
    if (projection.goal.remaining <= 0) return h('td', { class: 'r ok' }, 'done');
    // No ETA: nothing has measured a rate for it yet, or the plan gives it no start (the games
    // ahead of it hold their slots for good: no goal, or no rate yet to say when they end).
    if (!isNum(projection.rate_per_hour)) return h('td', { class: 'r muted', title: 'no rate measured for it yet' }, 'no rate yet');
    if (!isNum(projection.eta_hours)) {
      return h('td', { class: 'r muted', title: 'no start in the plan: the games ahead of it have no goal or no rate yet' }, 'no start');
    }
    return h('td', { class: 'r num', title: projection.eta_at ? 'at ' + fmtTime(projection.eta_at) : '' }, fmtHours(projection.eta_hours));
  }

  let onCluster = false; // cluster hosts recorded: the games table names each game's host

  // Settings its live worker was not started with (GET /games `pending`), in fleetd/games/fields.py's words.
  const PENDING_NOTE = 'pending until its next start (--restart applies it now)';
  const settingChange = (c) => c.text; // the CLI's own line (str(SettingChange)), from the daemon that serves the page

  function renderGames(games, projectionByName) {
    $('games-host').hidden = !onCluster;
    const body = $('games-body');
    body.replaceChildren();
    for (const g of games) {
      const ckpt = g.last_checkpoint;
      body.appendChild(h('tr', { 'data-game': g.name },
        h('td', { class: 'name' }, h('a', { href: '#game=' + encodeURIComponent(g.name), title: 'its recent log lines' }, g.name)),
        h('td', null, g.env_id),
        h('td', null, g.algo),
        h('td', null, h('span', { class: stateClass(g.state), title: g.state_reason || '' }, g.state),
          g.desired === 'stopped' && g.state !== 'exited' && g.state !== 'stopped' ? h('span', { class: 'muted small' }, ' → stop') : null,
          g.state_reason && g.state !== 'running' ? h('div', { class: 'muted small reason' }, g.state_reason) : null,
          (g.pending || []).length ? h('div', { class: 'warn small', 'data-pending': '' }, PENDING_NOTE + ': ' + g.pending.map(settingChange).join(', ')) : null),
        h('td', { class: 'r num' }, g.pid === null || g.pid === undefined ? DASH : String(g.pid)),
        h('td', { class: 'host-col', hidden: !onCluster }, g.host || DASH),
        h('td', { class: 'r num' }, fmtInt(g.steps)),
        h('td', { class: 'r num' }, fmtInt(g.episodes)),
        // null unless the game runs: the API says when its last report's rate is a rate now.
        h('td', { class: 'r num' + (isNum(g.episodes_per_hour) ? '' : ' muted') }, fmtNum(g.episodes_per_hour, 0)),
        h('td', { class: 'r num' }, fmtNum(g.mean_reward_100, 2)),
        h('td', { class: 'r num' }, fmtNum(g.best_reward, 1)),
        h('td', { class: 'r num' }, fmtNum(g.eval_return, 1)),
        healthCell(g),
        h('td', { class: 'r num', title: ckpt ? fmtTime(ckpt.created_at, { seconds: true }) + (ckpt.verified ? '' : ' (unverified)') : '' },
          ckpt ? fmtInt(ckpt.steps) : DASH),
        h('td', { class: 'r num' + (g.restarts > 0 ? ' warn' : '') }, fmtInt(g.restarts)),
        etaCell(projectionByName.get(g.name))));
    }
    $('games-empty').hidden = games.length > 0;
    $('games-table').hidden = games.length === 0;
  }

  // The page of games shown: `cursors[i]` opens page i (null: the first). The API pages by a
  // keyset cursor, so the way back is the cursors already seen.
  const paging = { cursors: [null], index: 0, next: null };

  function gamesPath() {
    const cursor = paging.cursors[paging.index];
    return '/games?limit=' + GAMES_PAGE + (cursor ? '&cursor=' + encodeURIComponent(cursor) : '');
  }

  function turnPage(step) {
    if (step > 0 && !paging.next) return;
    if (step < 0 && paging.index === 0) return;
    if (step > 0) paging.cursors[paging.index + 1] = paging.next;
    paging.index += step;
    paging.next = null; // the new page's own comes with it: a `next` meanwhile would reopen this one
    $('games-next').disabled = true;
    $('games-pager').dataset.loading = 'true';
    refresh();
  }

  function renderPager(count) {
    const first = paging.index * GAMES_PAGE;
    const more = paging.next ? ' of more' : '';
    $('games-range').textContent = count ? 'games ' + fmtInt(first + 1) + '–' + fmtInt(first + count) + more : '';
    $('games-prev').disabled = paging.index === 0;
    $('games-next').disabled = !paging.next;
    $('games-pager').hidden = paging.index === 0 && !paging.next;
    delete $('games-pager').dataset.loading;
  }

  function renderGamePlots(games, gameSeries) {
    const cards = games.map((g, i) => {
      const [returns, steps, evals, rollbacks] = gameSeries[i];
      const marks = { best: g.best_eval_return, bestSteps: g.best_eval_steps, rollbacks: (rollbacks && rollbacks.items) || [] };
      return h('article', { class: 'card', 'data-game': g.name },
        h('header', null, h('strong', null, g.name), ' ', h('span', { class: stateClass(g.state) }, g.state),
          g.health && g.health !== 'learning' ? h('span', { class: 'health-' + g.health, title: g.health_reason || '' }, ' ' + g.health) : null,
          h('span', { class: 'muted small' }, ' ' + g.env_id + ' · ' + g.algo)),
        h('div', { class: 'plots' },
          linePlot(returns, { label: 'mean return (100)', format: fmtCompact, key: g.name + ':mean_reward_100' }),
          linePlot(evals, { label: 'eval return', format: fmtCompact, key: g.name + ':eval_return', marks }),
          linePlot(steps, { label: 'steps', format: fmtCompact, kind: 'area', key: g.name + ':steps' })));
    });
    $('game-plots').replaceChildren(...cards);
    $('plots-panel').hidden = games.length === 0;
  }

  // A GPU read, but its memory reading nonsense that sample: left out of it, still there (as `fleetd status` says).
  const SKIPPED_GPU = 'no readings this sample (its memory reading was not a number in range; read again next sample)';
  const SKIPPED_GPU_THEN = 'no readings in that sample (its memory reading was not a number in range)';  // a reboot's detail

  function renderGpu(telemetry, gpuSeries) {
    const box = $('gpu');
    box.replaceChildren();
    if (!telemetry) {
      box.appendChild(h('p', { class: 'muted' }, 'no telemetry yet'));
      return;
    }
    if (!telemetry.available) {
      box.appendChild(h('p', { class: 'notice' }, 'GPU readings unavailable: ' + (telemetry.reason || 'no reason given')));
    }
    (telemetry.gpus || []).forEach((gpu, i) => {
      // A GPU's Xid errors in the window and its hardware throttling: the governor's pressure.
      const xids = gpu.xid_errors || [];
      const throttle = gpu.throttle || [];
      const distress = xids.length || throttle.length ? h('dl', { class: 'facts' }) : null;
      if (xids.length) fact(distress, 'Xid errors', h('span', { class: 'bad num' }, xids.join(', ')));
      if (throttle.length) fact(distress, 'throttled', h('span', { class: 'warn' }, throttle.join(', ')));
      if (gpu.lost || !telemetry.available) {  // fallen off the bus, or NVML unread: no readings, not 0 MiB at 0 %
        box.appendChild(h('div', { class: 'gpu', 'data-gpu': gpu.index },
          h('h3', null, 'GPU ' + gpu.index + ' ', h('span', { class: 'muted small' }, gpu.name || '')),
          h('p', { class: 'notice' }, gpu.lost ? 'lost (NVML: GPU is lost, fallen off the bus?): its workers cannot train'
            : 'no readings (' + (telemetry.stale ? 'telemetry stale' : 'NVML unavailable') + ')'),
          distress));
        return;
      }
      const frac = isNum(gpu.memory_fraction) ? gpu.memory_fraction : 0;
      const list = h('dl', { class: 'facts' });
      fact(list, 'utilization', h('span', { class: 'num' }, fmtPercent(gpu.utilization_pct)));
      fact(list, 'memory', h('span', { class: 'num' }, fmtBytes(gpu.memory_used_bytes) + ' / ' + fmtBytes(gpu.memory_total_bytes) + ' (' + fmtPct(frac, 0) + ')'),
        h('meter', { min: 0, max: 1, low: 0.8, high: 0.92, optimum: 0.5, value: frac }));
      fact(list, 'temperature', h('span', { class: 'num' + (gpu.temperature_c >= 85 ? ' warn' : '') }, isNum(gpu.temperature_c) ? gpu.temperature_c.toFixed(0) + ' °C' : DASH));
      fact(list, 'power', h('span', { class: 'num' }, isNum(gpu.power_w) ? gpu.power_w.toFixed(0) + ' W' : DASH));
      box.appendChild(h('div', { class: 'gpu', 'data-gpu': gpu.index },
        h('h3', null, 'GPU ' + gpu.index + ' ', h('span', { class: 'muted small' }, gpu.name || '')),
        list, distress,
        linePlot(gpuSeries[i], { label: 'utilization %', format: (v) => v.toFixed(0), key: 'gpu' + gpu.index + ':gpu_utilization_pct' })));
    });
    (telemetry.skipped_gpus || []).forEach((index) => {
      box.appendChild(h('div', { class: 'gpu', 'data-gpu': index },
        h('h3', null, 'GPU ' + index),
        h('p', { class: 'notice' }, SKIPPED_GPU)));
    });
    const host = telemetry.host;
    if (host) {
      const list = h('dl', { class: 'facts' });
      fact(list, 'host CPU', h('span', { class: 'num' }, fmtPercent(host.cpu_pct) + ' · load ' + fmtNum(host.load_1m, 2)));
      // null: no reading (missing, or out of its range): shown as a dash, not as 0 used.
      const used = isNum(host.memory_total_bytes) && isNum(host.memory_available_bytes) ? host.memory_total_bytes - host.memory_available_bytes : null;
      fact(list, 'host memory', h('span', { class: 'num' }, fmtBytes(used) + ' / ' + fmtBytes(host.memory_total_bytes)));
      // A stale sample (the telemetry job stalled): its frozen host readings are said to be old.
      fact(list, 'read at', h('span', { class: 'num' }, fmtTime(telemetry.at, { seconds: true })),
        telemetry.stale ? h('span', { class: 'warn' }, ' · ' + fmtDuration(telemetry.age_s) + ' ago: stale, the telemetry job stalled') : null);
      box.appendChild(h('h3', null, 'Host'));
      box.appendChild(list);
    }
    const processes = telemetry.processes || [];
    if (processes.length) {
      const rows = processes.map((p) => h('tr', null,
        h('td', null, p.game), h('td', { class: 'r num' }, String(p.pid)), h('td', { class: 'r num' }, String(p.processes)),
        h('td', { class: 'r num' }, fmtBytes(p.rss_bytes)), h('td', { class: 'r num' }, fmtPercent(p.cpu_pct)),
        h('td', { class: 'r num' }, gpuMemText(p))));
      box.appendChild(h('div', { class: 'scroll' }, h('table', { class: 'grid compact' },
        h('thead', null, h('tr', null, h('th', null, 'worker'), h('th', { class: 'r' }, 'pid'), h('th', { class: 'r' }, 'procs'),
          h('th', { class: 'r' }, 'RSS'), h('th', { class: 'r' }, 'CPU'), h('th', { class: 'r' }, 'GPU mem'))),
        h('tbody', null, rows))));
      // The GPUs read, the workers' share of them not (NVML's pids are another namespace's).
      if (telemetry.process_gpu_reason) box.appendChild(h('p', { class: 'notice' }, 'GPU mem: ' + telemetry.process_gpu_reason));
    }
  }

  // One window as one bar: up spans green, downtime red, reboots marked (unclean in red), unobserved grey.
  function timelineBar(boots, nowMs, windowMs, label) {
    const W = 420;
    const H = 50;
    const barY = 12;
    const barH = 20;
    const start = nowMs - windowMs;
    const x = (ms) => ((Math.min(Math.max(ms, start), nowMs) - start) / (nowMs - start)) * W;
    const chart = svg('svg', {
      class: 'timeline-bar', viewBox: '0 0 ' + W + ' ' + H, role: 'img', 'aria-label': 'boots over the ' + label, 'data-window-hours': windowMs / 3600000,
    });
    chart.appendChild(svg('rect', { class: 'unobserved', x: 0, y: barY, width: W, height: barH },
      svg('title', null, 'not observed by fleetd')));
    const span = (cls, from, to, title) => {
      if (!(to > start) || !(from < nowMs)) return;
      const x0 = x(from);
      const width = Math.max(x(to) - x0, 1.5);
      chart.appendChild(svg('rect', { class: 'span ' + cls, x: x0.toFixed(2), y: barY, width: width.toFixed(2), height: barH },
        svg('title', null, title)));
    };
    const marks = [];
    for (const boot of boots) {
      const upFrom = toMs(boot.booted_at);
      const upTo = boot.current ? nowMs : toMs(boot.last_seen_at);
      span('up', upFrom, upTo, 'up ' + fmtTime(upFrom) + ' → ' + (boot.current ? 'now' : fmtTime(upTo)) + ' (' + fmtDuration((upTo - upFrom) / 1000) + ')');
    }
    for (const boot of boots) { // over the up spans: a short outage stays visible
      const reboot = boot.reboot;
      if (reboot) {
        const downFrom = toMs(reboot.went_down_after);
        const downTo = toMs(reboot.back_at);
        span('down', downFrom, downTo, 'down ' + fmtTime(downFrom) + ' → ' + fmtTime(downTo) + ' (' + fmtDuration(reboot.downtime_s) + ')' + (reboot.clean ? ', clean' : ', unclean'));
        if (downTo > start) marks.push([downTo, reboot.clean, boot.id]);
      }
    }
    for (const [at, clean, id] of marks) { // each links to what the host looked like before it
      const mx = Math.min(Math.max(x(at), 4), W - 4);
      chart.appendChild(svg('a', { href: '#boot=' + id, class: 'boot-link' }, svg('path', { class: clean ? 'mark clean' : 'mark unclean', d: 'M' + (mx - 4).toFixed(1) + ' 1L' + (mx + 4).toFixed(1) + ' 1L' + mx.toFixed(1) + ' 10Z' },
        svg('title', null, (clean ? 'clean' : 'unclean') + ' reboot, back at ' + fmtTime(at) + ': show what the host looked like before'))));
    }
    // Ticks: local midnights on the week, every 6 hours on the day.
    const step = windowMs > 2 * DAY_MS ? DAY_MS : 6 * 3600000;
    const tick = new Date(start);
    if (step === DAY_MS) tick.setHours(24, 0, 0, 0);
    else tick.setHours(Math.floor(tick.getHours() / 6) * 6 + 6, 0, 0, 0);
    for (let t = tick.getTime(); t < nowMs - step / 8; t = tick.getTime()) {
      const tx = x(t);
      chart.appendChild(svg('line', { class: 'tick', x1: tx, x2: tx, y1: barY, y2: barY + barH }));
      const d = new Date(t);
      const text = step === DAY_MS ? d.toLocaleDateString('en-US', { weekday: 'short' }) + ' ' + d.getDate() : fmtClock(t);
      if (tx > 20 && tx < W - 20) chart.appendChild(svg('text', { class: 'tick-label', x: tx, y: H - 4, 'text-anchor': 'middle' }, text));
      if (step === DAY_MS) tick.setDate(tick.getDate() + 1); // DST-proof: the next local midnight
      else tick.setHours(tick.getHours() + 6);
    }
    return h('div', { class: 'timeline-row' }, h('span', { class: 'muted small' }, label), chart);
  }

  function renderTimeline(boots, nowMs) {
    const key = (cls, text) => h('span', { class: 'legend-item' }, h('span', { class: 'key ' + cls }), text);
    const legend = h('div', { class: 'legend small' },
      key('up', 'up'), key('down', 'down'), key('unclean', 'unclean reboot'), key('clean', 'clean reboot'), key('unobserved', 'not observed'));
    $('boot-timeline').replaceChildren(
      timelineBar(boots, nowMs, 7 * DAY_MS, 'last 7 days'),
      timelineBar(boots, nowMs, DAY_MS, 'last 24 h'),
      legend);
  }

  function renderUptime(uptime, boots) {
    const list = $('uptime');
    list.replaceChildren();
    fact(list, 'host up', h('span', { class: 'num' }, fmtDuration(uptime.host_uptime_s)), h('span', { class: 'muted small' }, ' since ' + fmtTime(uptime.booted_at)));
    fact(list, 'fleetd up', h('span', { class: 'num' }, fmtDuration(uptime.daemon_uptime_s)), h('span', { class: 'muted small' }, ' since ' + fmtTime(uptime.daemon_started_at)));
    fact(list, 'reboots', h('span', { class: 'num' + (uptime.reboots_24h > 0 ? ' warn' : '') }, uptime.reboots_24h + ' in 24 h · ' + uptime.reboots_7d + ' in 7 d'));
    fact(list, 'availability', h('span', { class: 'num' }, fmtPct(uptime.availability_24h) + ' in 24 h · ' + fmtPct(uptime.availability_7d) + ' in 7 d'));
    fact(list, 'mean time between reboots', h('span', { class: 'num' }, fmtDuration(uptime.mean_time_between_reboots_s)));
    const reboots = boots.filter((b) => b.reboot).slice(0, 8);
    const box = $('reboots');
    if (!reboots.length) {
      box.replaceChildren(h('p', { class: 'muted small' }, 'No reboots recorded.'));
      return;
    }
    box.replaceChildren(h('div', { class: 'scroll' }, h('table', { class: 'grid compact' },
      h('thead', null, h('tr', null, h('th', null, 'back at'), h('th', { class: 'r' }, 'up before'), h('th', { class: 'r' }, 'down'), h('th', null, ''))),
      h('tbody', null, reboots.map((b) => h('tr', null,
        h('td', { class: 'num' }, h('a', { href: '#boot=' + b.id, title: 'what the host looked like before' }, fmtTime(b.reboot.back_at))),
        h('td', { class: 'r num' }, fmtDuration(b.reboot.uptime_before_s)),
        h('td', { class: 'r num' }, fmtDuration(b.reboot.downtime_s)),
        h('td', { class: b.reboot.clean ? 'muted' : 'bad' }, b.reboot.clean ? 'clean' : 'unclean')))))));
  }

  // ---------------------------------------------------------------- cluster hosts

  const HOST_GAMES_SHOWN = 24; // names per host card; the rest are counted
  const HIDDEN_RESOURCES = /^(node:|fleetd_host_|memory$|object_store_memory$|accelerator_type:)/;

  function fmtResources(resources) {
    const r = resources || {};
    const parts = [];
    if (isNum(r.CPU)) parts.push(fmtNum(r.CPU, Number.isInteger(r.CPU) ? 0 : 1) + ' CPU');
    if (isNum(r.GPU)) parts.push(fmtNum(r.GPU, Number.isInteger(r.GPU) ? 0 : 1) + ' GPU');
    for (const [key, value] of Object.entries(r).sort()) {
      if (key === 'CPU' || key === 'GPU' || HIDDEN_RESOURCES.test(key)) continue;
      parts.push(key + ' ' + fmtCompact(value));
    }
    if (isNum(r.memory)) parts.push(fmtBytes(r.memory) + ' memory');
    return parts.join(' · ') || DASH;
  }

  // A host's own governor's rung (GET /hosts `governor`): a name, or {rung, tier, level, ...}.
  function fmtRung(rung) {
    if (rung === null || typeof rung !== 'object') return String(rung);
    const parts = [];
    if (rung.rung) parts.push(String(rung.rung));
    if (rung.tier) parts.push(rung.tier + ' tier');
    if (isNum(rung.level)) parts.push('level ' + rung.level);
    if (parts.length) return parts.join(' · ');
    return Object.entries(rung).map(([k, v]) => k + ' ' + (typeof v === 'object' ? JSON.stringify(v) : v)).join(' · ');
  }

  function hostCard(host, nowMs) {
    const lives = host.lives || [];
    const current = host.alive ? lives[lives.length - 1] : null;
    const list = h('dl', { class: 'facts' });
    fact(list, 'resources', h('span', { class: 'num' }, fmtResources(host.resources)));
    if (host.alive) {
      fact(list, 'up', h('span', { class: 'num' }, fmtDuration(host.uptime_s)),
        current ? h('span', { class: 'muted small' }, ' since ' + fmtTime(current.joined_at)) : null);
    } else {
      fact(list, 'lost', h('span', { class: 'bad num' }, 'down ' + fmtDuration((nowMs - toMs(host.last_seen_at)) / 1000)),
        h('span', { class: 'muted small' }, ' since ' + fmtTime(host.last_seen_at)));
    }
    fact(list, 'joined', h('span', { class: 'num' }, fmtTime(host.joined_at)), h('span', { class: 'muted small' }, ' first'));
    const seenAgo = Math.max(0, nowMs - toMs(host.last_seen_at)) / 1000; // a clock a hair ahead is "0 s ago"
    fact(list, 'last seen', h('span', { class: 'num' }, fmtDuration(seenAgo) + ' ago'), h('span', { class: 'muted small' }, ' at ' + fmtTime(host.last_seen_at, { seconds: true })));
    const reboots = Math.max(0, (host.boots || 0) - 1);
    fact(list, 'lives', h('span', { class: 'num' + (reboots > 0 ? ' warn' : '') }, fmtInt(host.boots) + ' boots · ' + fmtInt(reboots) + (reboots === 1 ? ' reboot' : ' reboots')));
    fact(list, 'downtime', h('span', { class: 'num' }, fmtDuration(host.downtime_s)), h('span', { class: 'muted small' }, ' in all, between lives'));
    const gov = host.governor; // its own governor (a host with CPUs on a cluster), else null
    if (gov) {
      const held = fmtInt((gov.games || []).length) + '/' + fmtInt(gov.allowed) + ' games held'
        + ((gov.guests || []).length ? ', ' + fmtInt(gov.guests.length) + ' guests' : '');
      fact(list, 'rung', h('span', { 'data-rung': '' }, fmtRung(gov)), h('span', { class: 'muted small' }, ' · ' + held));
    }
    const games = host.games || [];
    const shown = games.slice(0, HOST_GAMES_SHOWN);
    fact(list, 'games', h('span', { class: 'num' }, fmtInt(games.length)), ' ',
      h('span', { class: 'host-games' }, shown.map((name) => h('a', { href: '#game=' + encodeURIComponent(name), 'data-game': name, title: 'its recent log lines' }, name)),
        games.length > shown.length ? h('span', { class: 'muted small' }, 'and ' + fmtInt(games.length - shown.length) + ' more') : null));
    return h('article', { class: 'card host-card' + (host.alive ? '' : ' lost'), 'data-host': host.name },
      h('header', null, h('strong', null, host.name), ' ',
        h('span', { class: host.alive ? 'state state-running' : 'state state-fatal' }, host.alive ? 'alive' : 'lost'),
        h('span', { class: 'muted small' }, ' ' + [host.hostname, host.address].filter(Boolean).join(' · '))),
      list);
  }

  // Nothing at all on the local executor (no cluster hosts handed in): not an empty section.
  function renderHosts(hosts, nowMs) {
    const items = (hosts && hosts.items) || [];
    $('hosts-panel').hidden = items.length === 0;
    if (!items.length) {
      $('hosts').replaceChildren();
      return;
    }
    const alive = items.filter((host) => host.alive).length;
    const lost = items.length - alive;
    $('hosts-summary').replaceChildren(items.length + (items.length === 1 ? ' host' : ' hosts') + ' · ' + alive + ' alive',
      lost ? h('span', { class: 'bad' }, ' · ' + lost + ' lost') : '');
    $('hosts').replaceChildren(...items.map((host) => hostCard(host, nowMs)));
  }

  // ---------------------------------------------------------------- one reboot's forensics

  let shownBoot = null;

  async function showBoot(id) {
    shownBoot = id;
    const box = $('boot-detail');
    try {
      const boot = await api('/boots/' + encodeURIComponent(id));
      if (shownBoot !== id) return; // another reboot was chosen meanwhile: its answer is the one shown
      renderBootDetail(box, boot);
    } catch (error) {
      if (shownBoot !== id) return;
      box.replaceChildren(h('p', { class: 'bad small' }, 'boot ' + id + ': ' + error.message));
    }
    box.hidden = false;
  }

  function renderBootDetail(box, boot) {
    const before = boot.before_reboot;
    const list = h('dl', { class: 'facts' });
    if (!boot.reboot || !before) {
      fact(list, 'began', 'fleetd\'s first start here: no reboot before it recorded');
    } else {
      fact(list, 'reboot', (boot.reboot.clean ? 'clean' : 'unclean') + ': up ' + fmtDuration(boot.reboot.uptime_before_s) + ', down ' + fmtDuration(boot.reboot.downtime_s));
      fact(list, 'last heartbeat', fmtTime(before.last_seen_at));
      const state = before.last_state;
      if (!state) fact(list, 'state', 'not captured');
      else {
        if (state.governor) {
          fact(list, 'rung', state.governor.tier + ' tier, level ' + state.governor.level + ' · admitted: ' + (state.governor.admitted.join(', ') || '-'));
          const pressure = state.governor.pressure || [];
          if (pressure.length) fact(list, 'pressure', h('span', { class: 'warn' }, pressure.join('; ')));
          if (state.governor.last_backoff) fact(list, 'last back-off', state.governor.last_backoff);
        }
        const running = Object.entries(state.games || {}).filter(([, s]) => ['running', 'starting', 'stopping'].includes(s)).map(([name]) => name);
        fact(list, 'games running', running.join(', ') || '-');
        const telemetry = state.telemetry || {};
        for (const gpu of telemetry.gpus || []) {
          // NVML unread (gpu_available false): listed for its Xid errors, without readings, as `fleetd reboots --detail` says.
          const readings = gpu.lost ? 'lost (NVML: GPU is lost)' : telemetry.gpu_available === false ? 'no readings (NVML unavailable)'
            : fmtNum(gpu.temperature_c) + ' C, ' + fmtPct(gpu.memory_used_bytes / Math.max(1, gpu.memory_total_bytes)) + ' memory, ' + fmtNum(gpu.power_w) + ' W';
          const xids = gpu.xid_errors || [];
          const throttle = gpu.throttle || [];
          fact(list, 'GPU ' + gpu.index, gpu.name + ': ' + readings + (xids.length ? '; Xid errors ' + xids.join(', ') : '') +
            (throttle.length ? '; throttled: ' + throttle.join(', ') : ''));
        }
        for (const index of telemetry.skipped_gpus || []) fact(list, 'GPU ' + index, SKIPPED_GPU_THEN);
        if (telemetry.host) fact(list, 'host', fmtPct(hostAvailable(telemetry.host)) + ' memory available, load ' + fmtNum(telemetry.host.load_1m));
      }
      const kernel = before.kernel_warnings;
      fact(list, 'kernel warnings', !kernel ? 'not read yet' : (kernel.kept ? (kernel.note || '') : kernel.note));
      if (kernel && kernel.kept && kernel.lines.length) list.appendChild(h('dd', null, h('pre', { class: 'small' }, kernel.lines.join('\n'))));
    }
    box.replaceChildren(h('h3', null, 'Reboot #' + boot.id + ' (boot ' + boot.boot_id.slice(0, 8) + ')'), list);
  }

  // ---------------------------------------------------------------- one game's recent log

  const LOG_LINES = 40;
  let shownGame = null;

  async function showGameLog(name) {
    shownGame = name;
    const box = $('game-detail');
    const title = h('h3', null, name + ' ', h('span', { class: 'muted small' }, 'last ' + LOG_LINES + ' log lines · fleetd logs ' + name + ' -f'));
    let body;
    try {
      const text = await api('/games/' + encodeURIComponent(name) + '/logs?lines=' + LOG_LINES, { text: true });
      body = h('pre', { class: 'log small', 'data-game': name }, text);
    } catch (error) {
      if (error instanceof AuthError) throw error;
      // A game that has not run has no log yet (the daemon's 404 says runs: 0), nor has its first
      // run while it starts (starting: true), nor a Ray run whose worker has not written its first
      // line (written: false); any other 404 (no such game: a mistyped #game= link, a log gone or
      // removed) is the daemon's own words, as an error.
      const notRun = error.status === 404 && error.details.runs === 0;
      const starting = error.status === 404 && error.details.starting === true;
      const unwritten = error.status === 404 && error.details.written === false;
      body = notRun ? h('p', { class: 'muted small' }, 'no log yet: it has not run')
        : starting ? h('p', { class: 'muted small' }, 'no log yet: its first run is starting')
        : unwritten ? h('p', { class: 'muted small' }, 'no log yet: its worker has not written its first line')
        : h('p', { class: 'bad small' }, error.message);
    }
    if (shownGame !== name) return; // another game was chosen meanwhile
    box.replaceChildren(title, body);
    $('game-panel').hidden = false;
  }

  function gameFromHash() {
    const match = /(?:^#|&)game=([^&]+)/.exec(location.hash);
    if (match) showGameLog(decodeURIComponent(match[1]));
  }

  window.addEventListener('hashchange', gameFromHash);

  function bootFromHash() {
    const match = /(?:^#|&)boot=(\d+)/.exec(location.hash);
    if (match) showBoot(match[1]);
  }

  window.addEventListener('hashchange', bootFromHash);

  // The plan's timeline: one bar per planned game, from its start to its ETA (hours from now),
  // drawn in the page's own SVG as the plots are; a game without an ETA runs to the edge, open.
  const PLAN_BARS = 60;

  // No game planned has a goal: the fleet's hours "to all goals" are 0 (none to reach), which
  // would read as done; the page says there are none.
  function goalless(projection) {
    return (projection.games || []).every((g) => !g.goal || g.plan_state === 'off');
  }

  function planTimeline(projection) {
    const planned = (projection.games || []).filter((g) => g.plan_state === 'running' || g.plan_state === 'pending');
    if (!planned.length) return h('p', { class: 'muted small' }, 'nothing to plan: no game waits for its goal');
    const shown = planned.slice(0, PLAN_BARS);
    const ends = shown.map((g) => (isNum(g.eta_hours) ? g.eta_hours : g.start_hours)).filter(isNum);
    const total = goalless(projection) ? null : projection.fleet.hours_to_all_goals;
    const span = Math.max(isNum(total) ? total : Math.max(0, ...ends) * 1.1, 1 / 60);
    const W = 900;
    const left = 130;
    const right = 8;
    const rowH = 16;
    const top = 4;
    const H = top + shown.length * rowH + 22;
    const x = (hours) => left + (Math.min(Math.max(hours, 0), span) / span) * (W - left - right);
    const chart = svg('svg', {
      class: 'plan-timeline', viewBox: '0 0 ' + W + ' ' + H, role: 'img', 'aria-label': 'the plan: each game from its start to its goal',
      'data-hours': span,
    });
    shown.forEach((g, i) => {
      const y = top + i * rowH;
      chart.appendChild(svg('text', { class: 'plan-label', x: left - 6, y: y + rowH - 5, 'text-anchor': 'end' }, g.name));
      if (!isNum(g.start_hours)) {
        chart.appendChild(svg('text', { class: 'plan-note', x: left + 4, y: y + rowH - 5 }, 'no slot before the last goal'));
        return;
      }
      const open = !isNum(g.eta_hours);
      const x0 = x(g.start_hours);
      const x1 = open ? W - right : x(g.eta_hours);
      const title = g.name + ': ' + (g.plan_state === 'running' ? 'running now' : 'starts in ' + fmtHours(g.start_hours)) +
        ', ' + (open ? 'no ETA yet' : 'goal in ' + fmtHours(g.eta_hours) + (g.eta_at ? ' (' + fmtTime(g.eta_at) + ')' : '')) +
        ' · rate from ' + g.rate_source;
      chart.appendChild(svg('rect', {
        class: 'plan-bar ' + g.plan_state + (open ? ' open' : ''), 'data-game': g.name,
        x: x0.toFixed(2), y: y + 2, width: Math.max(x1 - x0, 1.5).toFixed(2), height: rowH - 4,
      }, svg('title', null, title)));
    });
    const axisY = top + shown.length * rowH;
    const axis = svg('g', { class: 'axis' });
    axis.appendChild(svg('line', { x1: left, x2: W - right, y1: axisY + 2, y2: axisY + 2 }));
    axis.appendChild(svg('text', { x: left, y: axisY + 16, 'text-anchor': 'start' }, 'now'));
    // The axis is at least a minute wide, its label the totals' own figure: goals reached, or under
    // half a minute away, are not said to be a minute away.
    axis.appendChild(svg('text', { x: W - right, y: axisY + 16, 'text-anchor': 'end' },
      isNum(total) && total > 0 ? 'all goals in ' + fmtHours(total) : fmtHours(span)));
    chart.appendChild(axis);
    const more = planned.length > shown.length ? h('p', { class: 'muted small' }, 'and ' + fmtInt(planned.length - shown.length) + ' more games (fleetd plan lists all)') : null;
    return h('div', { id: 'plan-timeline' }, chart, more);
  }

  // When a game's training starts, in the plan: now, in so many hours, or (as `fleetd plan` says)
  // done, or the state that keeps a game out of the plan (stopped, fatal, ...).
  function startsIn(g) {
    if (g.plan_state === 'running') return 'now';
    if (g.plan_state === 'done') return 'done';
    if (g.plan_state === 'off') return g.state || DASH;
    return fmtHours(g.start_hours);
  }

  function renderProjection(projection) {
    const panel = $('projection-panel');
    if (!projection) {
      panel.hidden = true; // no /api/v1/projection on this daemon
      return;
    }
    panel.hidden = false;
    const box = $('projection');
    if (projection.error && !projection.fleet) {
      box.replaceChildren(h('p', { class: 'notice' }, 'projection unavailable: ' + projection.error));
      return;
    }
    const currency = projection.currency;
    const rows = (projection.games || []).map((g) => h('tr', null,
      h('td', { class: 'name' }, g.name),
      h('td', null, g.goal ? fmtInt(g.goal.target) + ' ' + g.goal.kind : h('span', { class: 'muted' }, 'no goal')),
      h('td', { class: 'r num' }, g.goal ? fmtInt(g.goal.done) : DASH),
      h('td', { class: 'r num', title: 'rate from: ' + g.rate_source }, fmtNum(g.rate_per_hour, 0)),
      h('td', { class: 'r num' }, startsIn(g)),
      h('td', { class: 'r num' }, fmtHours(g.eta_hours)),
      h('td', { class: 'num' }, g.eta_at ? fmtTime(g.eta_at) : DASH),
      h('td', { class: 'r num' }, fmtMoney(g.cost_to_goal, currency))));
    const table = h('div', { class: 'scroll' }, h('table', { class: 'grid' },
      h('thead', null, h('tr', null, h('th', null, 'game'), h('th', null, 'goal'), h('th', { class: 'r' }, 'done'),
        h('th', { class: 'r' }, 'rate/h'), h('th', { class: 'r' }, 'starts in'), h('th', { class: 'r' }, 'ETA'), h('th', null, 'ETA at'), h('th', { class: 'r' }, 'cost to goal'))),
      h('tbody', null, rows)));
    const fleet = projection.fleet || {};
    const totals = h('dl', { class: 'facts' });
    fact(totals, 'price', projection.price_per_host_hour > 0
      ? h('span', { class: 'num' }, fmtMoney(projection.price_per_host_hour, currency) + ' per host hour')
      : h('span', { class: 'muted' }, 'not set ([costs] price_per_host_hour)'));
    fact(totals, 'rung', h('span', { class: 'num' }, fleet.rung + ' · ' + fmtInt(fleet.running_games) + ' running, ' + fmtInt(fleet.pending_games) + ' pending'));
    fact(totals, 'all goals in', goalless(projection) ? h('span', { class: 'muted' }, 'no goal to reach (none set, or their games stopped)') : h('span', { class: 'num' }, fmtHours(fleet.hours_to_all_goals) +
      (isNum(fleet.hours_to_all_goals) && fleet.hours_to_all_goals >= 48 ? ' (' + fleet.hours_to_all_goals.toFixed(0) + ' h)' : '')));
    const downtime = projection.downtime;
    if (downtime) {
      fact(totals, 'of which reboots', h('span', { class: 'num' + (downtime.share > 0.05 ? ' warn' : '') },
        fmtHours(fleet.downtime_hours) + ' (' + fmtPct(downtime.share, 1) + ': ' + fmtNum(downtime.reboots_per_day, 1) + ' a day × ' + fmtDuration(downtime.mean_downtime_s) + ')'));
    }
    const reach = !goalless(projection);  // none to reach: no cost to it, no what-if of it
    if (reach) fact(totals, 'cost to all goals', h('span', { class: 'num' }, fmtMoney(fleet.cost_to_all_goals, currency)));
    for (const rung of reach ? projection.what_if || [] : []) {
      if (rung.current) continue;
      fact(totals, 'at ' + rung.rung + (rung.proven ? '' : ' (unproven)'), h('span', { class: 'num' },
        fmtHours(rung.hours_to_all_goals) + (isNum(rung.cost_to_all_goals) ? ' · ' + fmtMoney(rung.cost_to_all_goals, currency) : '')));
    }
    const error = projection.error;
    if (error && isNum(error.median_abs_relative_error)) {
      fact(totals, 'plan error', h('span', { class: 'num' }, fmtPct(error.median_abs_relative_error, 0) + ' median over ' + fmtInt(error.games.length) + ' games'));
    }
    box.replaceChildren(planTimeline(projection), h('div', { class: 'split' }, table, totals));
  }

  const SEVERITY_CLASS = { warning: 'warn', error: 'bad' }; // as `fleetd events` colours them

  function eventRow(event) {
    return h('tr', { class: SEVERITY_CLASS[event.severity] || null, 'data-severity': event.severity },
      h('td', { class: 'num' }, fmtTime(event.at, { seconds: true })),
      h('td', null, event.severity),
      h('td', null, event.kind),
      h('td', null, eventGame(event)),
      h('td', { class: 'message' }, event.message));
  }

  // A game removed since (one added later under its name is another) is marked, as `fleetd events` marks it.
  function eventGame(event) {
    if (!event.game) return DASH;
    return event.removed_game ? event.game + ' (removed)' : event.game;
  }

  function renderEvents(events) {
    const box = $('events');
    if (events.error) {
      box.replaceChildren(h('p', { class: 'notice' }, 'events unavailable: ' + events.error));
      return;
    }
    const items = events.items || [];
    if (!items.length) {
      box.replaceChildren(h('p', { class: 'muted' }, 'none'));
      return;
    }
    box.replaceChildren(h('div', { class: 'scroll' }, h('table', { class: 'grid compact' },
      h('thead', null, h('tr', null, h('th', null, 'at'), h('th', null, 'severity'), h('th', null, 'kind'),
        h('th', null, 'game'), h('th', null, 'message'))),
      h('tbody', null, items.map(eventRow)))));
    if (events.next_before) box.appendChild(h('p', { class: 'muted small' }, 'older: ', h('code', null, 'fleetd events --before ' + events.next_before)));
  }

  function renderSummary(games, fleet) {
    const counts = new Map();
    for (const g of games) counts.set(g.state, (counts.get(g.state) || 0) + 1);
    const parts = STATES.filter((s) => counts.has(s)).map((s) => h('span', { class: stateClass(s) }, counts.get(s) + ' ' + s));
    const paged = paging.index > 0 || paging.next ? ' on this page' : '';
    const known = !fleet.error; // the fleet answers once the governor has taken its first step
    const fleetWide = paged && known ? ' · ' + fleet.admitted.length + ' admitted, ' + fleet.pending.length + ' pending' : '';
    $('summary').replaceChildren(...parts.flatMap((p, i) => (i ? [' ', p] : [p])), parts.length && known ? paged + fleetWide + ' · ' : paged,
      known ? 'tier ' + fleet.tier : '');
  }

  // ---------------------------------------------------------------- the loop

  let timer = null;
  const load = { running: false, again: false };
  let lastGood = null;
  let lastProjection = new Map(); // ETAs by game, from the last projection (drawn before the new one arrives)

  function showLogin(reason) {
    document.body.dataset.state = 'login';
    $('loading').hidden = true;
    $('login').hidden = false;
    $('main').hidden = true;
    $('logout').hidden = true;
    $('banner').hidden = true;
    if (reason) $('login-reason').textContent = reason;
    $('login-token').focus();
  }

  function showBanner(message) {
    const banner = $('banner');
    banner.textContent = message + (lastGood ? ' Showing data from ' + fmtTime(lastGood, { seconds: true }) + '.' : '') + ' Retrying every 10 s.';
    banner.hidden = false;
  }

  // Whether a refresh starts now. One asked for while another runs (a page turned) is not lost:
  // `again` runs it as soon as that one ends.
  function mayRefresh(state) {
    if (state.running) {
      state.again = true;
      return false;
    }
    state.running = true;
    return true;
  }

  async function refresh() {
    if (!mayRefresh(load)) return;
    if (!readToken()) {
      load.running = false;
      clearTimeout(timer); // nothing to poll until a token is given
      showLogin();
      return;
    }
    const token = readToken();
    let page = paging.index;
    // What this refresh loads is dropped if another page is turned to meanwhile, or the token is
    // forgotten (or another given) meanwhile: a forgotten token's fleet is not shown again.
    const stale = () => paging.index !== page || readToken() !== token;
    try {
      // The projection covers every game: it may take longer, so the rest does not wait for it.
      const projectionLoad = api('/projection', { optional: true }).catch((error) => {
        if (error instanceof AuthError) throw error;
        return { error: error.message };
      });
      const eventsLoad = recentEvents();
      // GET /fleet answers 503 until the governor's first step (recovery after a start, the host
      // just rebooted): the games are shown meanwhile, the fleet panel says why it has none.
      const fleetLoad = api('/fleet').catch((error) => {
        if (error.status === 503) return { error: error.message };
        throw error;
      });
      let [games, fleet, boots, uptime, hosts] = await Promise.all([
        api(gamesPath()), fleetLoad, api('/boots?limit=1000'), api('/uptime'), api('/hosts', { optional: true }),
      ]);
      if (stale()) return;
      if (paging.index > 0 && !(games.items || []).length) { // the page emptied: back to the first
        Object.assign(paging, { cursors: [null], index: 0 });
        page = 0;
        games = await api(gamesPath());
        if (stale()) return;
      }
      paging.next = games.next_cursor || null;
      const items = games.items || [];
      const plotted = items.filter((g) => g.steps > 0).slice(0, PLOTTED_GAMES);
      const gpus = (fleet.telemetry && fleet.telemetry.gpus) || [];
      const [gameSeries, gpuSeries] = await Promise.all([
        Promise.all(plotted.map((g) => Promise.all([
          series({ game: g.name, metric: 'mean_reward_100' }),
          series({ game: g.name, metric: 'steps' }),
          series({ game: g.name, metric: 'eval_return' }),
          rollbackEvents(g),
        ]))),
        Promise.all(gpus.map((gpu) => series({ gpu: String(gpu.index), metric: 'gpu_utilization_pct' }))),
      ]);
      forgetUnusedSeries();
      if (stale()) return;
      // The server's clock, so a skewed laptop clock does not shift the timeline.
      const serverNow = toMs(uptime.daemon_started_at) + uptime.daemon_uptime_s * 1000;
      const nowMs = Number.isFinite(serverNow) ? serverNow : Date.now();

      $('loading').hidden = true;
      $('login').hidden = true;
      $('main').hidden = false;
      $('logout').hidden = false;
      // The Hosts section is a cluster's: on one host its one row (its kernel boots) is what the
      // boot timeline and the uptime panel already show.
      const clusterHosts = hosts && hosts.backend !== 'local' ? hosts : null;
      onCluster = Boolean(clusterHosts && (clusterHosts.items || []).length);
      renderSummary(items, fleet);
      renderFleet(fleet, nowMs);
      renderGames(items, lastProjection);
      renderPager(items.length);
      renderGamePlots(plotted, gameSeries);
      renderGpu(fleet.telemetry, gpuSeries);
      renderTimeline(boots.items || [], nowMs);
      renderUptime(uptime, boots.items || []);
      renderHosts(clusterHosts, nowMs);
      const events = await eventsLoad;
      if (stale()) return;
      renderEvents(events);
      const projection = await projectionLoad;
      lastProjection = new Map(((projection && projection.games) || []).map((g) => [g.name, g]));
      if (stale()) return;
      renderGames(items, lastProjection);
      renderProjection(projection);
      if (shownGame) await showGameLog(shownGame);
      lastGood = Date.now();
      $('updated').textContent = 'updated ' + fmtTime(lastGood, { seconds: true }).slice(11);
      $('banner').hidden = true;
      document.body.dataset.state = 'ready';
      document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
    } catch (error) {
      if (readToken() !== token) return; // forgotten meanwhile: the token field stays
      if (error instanceof AuthError) {
        storeToken('');
        showLogin(error.message); // and no polling (finally) until a token is given
      } else {
        if (document.body.dataset.state !== 'ready') document.body.dataset.state = 'error';
        $('loading').hidden = true;
        delete $('games-pager').dataset.loading;
        showBanner(String(error.message || error));
      }
    } finally {
      load.running = false;
      if (load.again) {
        load.again = false;
        refresh();
      } else if (readToken()) {
        schedule();
      }
    }
  }

  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(() => {
      if (document.hidden) schedule(); // a background tab polls nothing; it catches up when shown
      else refresh();
    }, REFRESH_MS);
  }

  function start() {
    $('login-url').textContent = location.origin + '/#token=…';
    takeTokenFromFragment();
    $('login-form').addEventListener('submit', (event) => {
      event.preventDefault();
      const input = $('login-token');
      const token = input.value.trim();
      input.value = '';
      if (!token) return;
      storeToken(token);
      document.body.dataset.state = 'loading';
      $('login').hidden = true;
      $('loading').hidden = false;
      refresh();
    });
    $('games-prev').addEventListener('click', () => turnPage(-1));
    $('games-next').addEventListener('click', () => turnPage(1));
    $('logout').addEventListener('click', () => {
      storeToken('');
      seriesCache.clear();
      clearTimeout(timer);
      showLogin('Token forgotten.');
    });
    window.addEventListener('hashchange', () => {
      if (takeTokenFromFragment()) refresh();
    });
    document.addEventListener('visibilitychange', () => {
      if (!document.hidden && readToken()) refresh();
    });
    refresh();
    if (readToken()) bootFromHash(); // a link to one reboot, opened directly
    if (readToken()) gameFromHash(); // or to one game's log
  }

  start();
})();
