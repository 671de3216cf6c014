// Arbor's web view (docs/ui.md). Plain JS, no build step. Every string
// that comes from the server goes into the DOM as text (textContent or
// an attribute value), never as markup: commands and output are the
// sandbox's.
'use strict';
(() => {
  const SVGNS = 'http://www.w3.org/2000/svg';
  const DX = 40, DY = 30, PAD = 22, LABEL = 150;
  const $ = (id) => document.getElementById(id);

  const ui = {
    envs: new Map(), // id -> row, with seenAt (ms) for the idle clock
    tasks: [],
    scope: null, // {env} or {task}
    tree: null, // {nodes: Map, envs: Map, truncated}
    selected: null,
    diffA: null, // the node picked as the diff's first state
    reloadTimer: 0,
  };
  // How an env that ended is drawn at its leaf (docs/ui.md).
  const ENDS = { finish: 'finished', discard: 'discarded', close: 'closed', promote: 'promoted' };
  const reward = (r) => (Number.isInteger(r) ? String(r) : Number(r).toPrecision(3).replace(/\.?0+$/, ''));

  // el makes an HTML element with a class and text.
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function sv(tag, attrs) {
    const e = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    return e;
  }
  const short = (id) => (id || '').replace(/^([a-z]+-)?(.{8}).*$/, '$1$2');
  function bytes(n) {
    if (!n) return '0 B';
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : n) + ' ' + u[i];
  }
  function secs(s) {
    if (s < 1) return (s * 1000).toFixed(0) + ' ms';
    if (s < 90) return s.toFixed(1) + ' s';
    if (s < 5400) return (s / 60).toFixed(1) + ' min';
    return (s / 3600).toFixed(1) + ' h';
  }

  async function getJSON(url) {
    const r = await fetch(url, { credentials: 'same-origin', cache: 'no-store' });
    if (!r.ok) throw new Error(url + ': ' + r.status + ' ' + (await r.text()));
    return r.json();
  }

  // ---- envs table -------------------------------------------------------

  async function loadEnvs() {
    const d = await getJSON('/ui/api/envs');
    const now = performance.now();
    ui.envs = new Map(d.envs.map((e) => [e.id, Object.assign(e, { seenAt: now })]));
    ui.tasks = d.tasks || [];
    renderEnvs();
    renderTaskPick();
  }

  function idleOf(e) { return e.idle_s + (performance.now() - e.seenAt) / 1000; }

  function envRow(e) {
    const tr = el('tr');
    tr.dataset.env = e.id;
    if (ui.scope && ui.scope.env === e.id) tr.classList.add('selected');
    const last = e.last || null;
    const cells = [
      ['id', e.id], ['', e.task || ''], ['', e.image], ['', e.lost ? 'lost' : e.turn], ['id', short(e.head)],
      ['cmd', last ? last.cmd : ''], ['', last ? last.exit : ''], ['idle', e.lost ? '' : secs(idleOf(e))], ['id', e.origin || ''],
      ['', e.node || ''],
    ];
    for (const [cls, text] of cells) tr.append(el('td', cls, text));
    if (last) {
      tr.children[5].title = last.cmd;
      if (last.exit !== 0) tr.children[6].classList.add('exit-bad');
    }
    if (e.lost) tr.title = 'lost: ' + e.lost;
    tr.addEventListener('click', () => setScope({ env: e.id }));
    return tr;
  }

  function renderEnvs() {
    const rows = [...ui.envs.values()].map(envRow);
    document.querySelector('#envs tbody').replaceChildren(...rows);
    $('envs-empty').hidden = rows.length > 0;
    $('env-count').textContent = '(' + rows.length + ')';
  }

  function updateEnvRow(id) {
    const e = ui.envs.get(id);
    const old = document.querySelector('#envs tbody tr[data-env="' + CSS.escape(id) + '"]');
    if (e && old) old.replaceWith(envRow(e));
  }

  function tickIdle() {
    for (const tr of document.querySelectorAll('#envs tbody tr')) {
      const e = ui.envs.get(tr.dataset.env);
      const td = tr.querySelector('td.idle');
      if (e && td && !e.lost) td.textContent = secs(idleOf(e));
    }
  }

  function renderTaskPick() {
    const sel = $('task-pick');
    const opts = [el('option', '', '(pick)')];
    opts[0].value = '';
    for (const t of ui.tasks) {
      const o = el('option', '', t);
      o.value = t;
      opts.push(o);
    }
    sel.replaceChildren(...opts);
    sel.value = ui.scope && ui.scope.task ? ui.scope.task : '';
  }

  // ---- scope ------------------------------------------------------------

  function scopeFromHash() {
    const p = new URLSearchParams(location.hash.slice(1));
    if (p.get('env')) return { env: p.get('env') };
    if (p.get('task')) return { task: p.get('task') };
    return null;
  }

  function setScope(s) {
    const p = new URLSearchParams(s.env ? { env: s.env } : { task: s.task });
    if (location.hash.slice(1) !== p.toString()) location.hash = p.toString();
    else applyScope();
  }

  function applyScope() {
    ui.scope = scopeFromHash();
    ui.selected = null;
    $('scope').textContent = ui.scope ? (ui.scope.env ? 'of env ' + ui.scope.env : 'of task ' + ui.scope.task) : '';
    for (const tr of document.querySelectorAll('#envs tbody tr')) {
      tr.classList.toggle('selected', !!ui.scope && ui.scope.env === tr.dataset.env);
    }
    $('task-pick').value = ui.scope && ui.scope.task ? ui.scope.task : '';
    loadTree().catch(showError);
  }

  // ---- tree -------------------------------------------------------------

  async function loadTree() {
    if (!ui.scope) {
      ui.tree = null;
      renderTree();
      return;
    }
    const q = ui.scope.env ? 'env=' + encodeURIComponent(ui.scope.env) : 'task=' + encodeURIComponent(ui.scope.task);
    setTree(await getJSON('/ui/api/tree?' + q));
  }

  // setTree replaces the tree with one the server sent (or a test made).
  function setTree(t) {
    ui.tree = {
      nodes: new Map(t.nodes.map((n) => [n.id, n])),
      envs: new Map((t.envs || []).map((e) => [e.id, e])),
      truncated: !!t.truncated,
    };
    renderTree();
  }

  function scheduleTreeReload() {
    clearTimeout(ui.reloadTimer);
    ui.reloadTimer = setTimeout(() => loadTree().catch(showError), 150);
  }

  // layout places every node: columns by depth, one row per leaf; a
  // node's first child (the same env's next turn when it has one) stays
  // on its row, so an env's history reads left to right and each branch
  // opens a row below. Returns {pos: Map id -> {x, y}, rows, cols}.
  function layout(nodes) {
    const kids = new Map();
    const roots = [];
    for (const n of nodes.values()) {
      if (n.parent && nodes.has(n.parent)) {
        if (!kids.has(n.parent)) kids.set(n.parent, []);
        kids.get(n.parent).push(n);
      } else roots.push(n);
    }
    const order = (p) => (a, b) =>
      (a.env === p.env ? 0 : 1) - (b.env === p.env ? 0 : 1) || a.turn - b.turn ||
      String(a.created).localeCompare(String(b.created)) || a.id.localeCompare(b.id);
    roots.sort((a, b) => a.turn - b.turn || a.id.localeCompare(b.id));
    const pos = new Map();
    let row = 0, cols = 0;
    // Iterative depth-first walk: deep trees must not exhaust the stack.
    for (const r of roots) {
      const stack = [[r, 0]];
      while (stack.length) {
        const [n, depth] = stack.pop();
        const ks = (kids.get(n.id) || []).sort(order(n));
        // Pre-order: a node takes the row its first child's chain ends
        // on; only a leaf moves on to the next row.
        pos.set(n.id, { x: depth, y: row });
        cols = Math.max(cols, depth + 1);
        if (ks.length === 0) row++;
        for (let i = ks.length - 1; i >= 0; i--) stack.push([ks[i], depth + 1]);
      }
    }
    return { pos, rows: row, cols };
  }

  function nodeTitle(n) {
    const lines = [(n.kind === 'none' ? 'turn ' + n.turn + ' (no checkpoint) on ' : 'state ') + n.state,
      'env ' + n.env + ' · turn ' + n.turn + ' · ' + n.kind + ' · ' + n.status.replace('_', ' ')];
    if (n.note) {
      lines.push('exit ' + n.note.exit + (n.note.timed_out ? ' (timed out)' : ''));
      if (n.note.cmd) lines.push('$ ' + n.note.cmd);
    }
    if (n.heads && n.heads.length) lines.push('head of ' + n.heads.join(', '));
    if (n.reward !== undefined && n.reward !== null) lines.push('reward ' + reward(n.reward));
    if (n.end) lines.push('its env ' + (ENDS[n.end] || n.end));
    return lines.join('\n');
  }

  function renderTree() {
    const svg = $('tree');
    const t = ui.tree;
    $('tree-hint').hidden = !!(t && t.nodes.size);
    if (!t) {
      svg.replaceChildren();
      svg.setAttribute('width', 0);
      svg.setAttribute('height', 0);
      $('tree-stats').textContent = '';
      return;
    }
    const { pos, rows, cols } = layout(t.nodes);
    const X = (p) => PAD + p.x * DX, Y = (p) => PAD + p.y * DY;
    const edges = sv('g', { class: 'edges' });
    const dots = sv('g', { class: 'nodes' });
    let states = 0, nones = 0, branches = 0, rolled = 0, rewarded = 0;
    const ended = { finish: 0, discard: 0, close: 0, promote: 0 };
    const small = t.nodes.size <= 200; // turn numbers under the nodes
    for (const n of t.nodes.values()) {
      const p = pos.get(n.id);
      if (n.kind === 'none') nones++; else states++;
      if (n.status === 'rolled_back') rolled++;
      if (n.end) ended[n.end] = (ended[n.end] || 0) + 1;
      if (n.reward !== undefined && n.reward !== null) rewarded++;
      if (n.parent && t.nodes.has(n.parent)) {
        const q = pos.get(n.parent);
        const x1 = X(q), y1 = Y(q), x2 = X(p), y2 = Y(p);
        const d = y1 === y2 ? `M${x1},${y1}H${x2}` : `M${x1},${y1}C${x1 + DX * 0.6},${y1} ${x2 - DX * 0.6},${y2} ${x2},${y2}`;
        const e = sv('path', { d, class: 'edge ' + n.status + (n.branch ? ' branch' : '') });
        e.dataset.from = n.parent;
        e.dataset.to = n.id;
        e.dataset.status = n.status;
        if (n.branch) { e.dataset.branch = '1'; branches++; }
        edges.append(e);
      }
      const g = sv('g', { class: 'node kind-' + n.kind + ' ' + n.status, transform: `translate(${X(p)},${Y(p)})` });
      if (n.note && n.note.exit !== 0) g.classList.add('failed');
      if (ui.selected === n.id) g.classList.add('selected');
      if (ui.diffA === n.id) g.classList.add('diff-a');
      Object.assign(g.dataset, { id: n.id, state: n.state, kind: n.kind, status: n.status, env: n.env, turn: n.turn });
      if (n.note) g.dataset.exit = n.note.exit;
      const title = sv('title');
      title.textContent = nodeTitle(n);
      g.append(title, sv('circle', { class: 'dot', r: n.kind === 'none' ? 5 : 8 }));
      if (n.end) {
        // The leaf of an env that ended: a mark by how (legend).
        g.dataset.end = n.end;
        g.classList.add('end-' + n.end);
        g.append(endMark(n.end));
      }
      if (n.reward !== undefined && n.reward !== null) {
        g.dataset.reward = n.reward;
        const rl = sv('text', { class: 'reward', x: -9, y: -7, 'text-anchor': 'end' });
        rl.textContent = reward(n.reward);
        if (n.reward <= 0) rl.classList.add('zero');
        g.append(rl);
      }
      if (small) {
        const tl = sv('text', { class: 'turn', x: 0, y: 20, 'text-anchor': 'middle' });
        tl.textContent = n.turn;
        g.append(tl);
      }
      if (n.heads && n.heads.length) {
        g.dataset.heads = n.heads.join(' ');
        g.append(sv('circle', { class: 'head', r: 12 }));
        const label = sv('text', { class: 'label', x: 16, y: 4 });
        label.textContent = n.heads.map(short).join(', ');
        g.append(label);
      }
      g.addEventListener('click', () => select(n.id));
      dots.append(g);
    }
    svg.replaceChildren(edges, dots);
    svg.setAttribute('width', PAD * 2 + Math.max(cols - 1, 0) * DX + LABEL);
    svg.setAttribute('height', PAD * 2 + Math.max(rows - 1, 0) * DY);
    $('tree-stats').textContent = `${states} states · ${nones} turns without checkpoint · ${branches} branch edges · ` +
      `${rolled} rolled back · ${ended.finish} finished · ${ended.discard} discarded · ${ended.close + ended.promote} closed · ` +
      `${rewarded} with a reward` + (t.truncated ? ' · truncated' : '');
    if (ui.selected && t.nodes.has(ui.selected)) showDetail(t.nodes.get(ui.selected));
  }

  // endMark is the mark on an ended env's leaf: a check (finished), a
  // cross (discarded), a bar (closed, promoted).
  function endMark(end) {
    const d = end === 'finish' ? 'M9,-3l3,4l6,-8' : end === 'discard' ? 'M9,-5l8,8M17,-5l-8,8' : 'M10,-5v10M15,-5v10';
    return sv('path', { class: 'end-mark', d });
  }

  function select(id) {
    ui.selected = id;
    for (const g of document.querySelectorAll('#tree g.node')) g.classList.toggle('selected', g.dataset.id === id);
    showDetail(ui.tree.nodes.get(id));
  }

  function showDetail(n) {
    const box = $('detail');
    const dl = el('dl');
    const row = (k, v) => { dl.append(el('dt', '', k), el('dd', '', v)); };
    row('state', n.state);
    row('env', n.env);
    row('turn', n.turn);
    row('checkpoint', n.kind + (n.pending ? ' (running)' : ''));
    row('status', n.status.replace('_', ' '));
    if (n.heads && n.heads.length) row('head of', n.heads.join(', '));
    if (n.reward !== undefined && n.reward !== null) row('reward', reward(n.reward));
    if (n.end) row('env ended', ENDS[n.end] || n.end);
    if (n.created) row('at', new Date(n.created).toLocaleTimeString());
    const parts = [el('h3', '', n.kind === 'none' ? 'turn ' + n.turn + ' on ' + n.state : n.state), dl];
    const note = n.note;
    if (note) {
      const nd = el('dl');
      const r2 = (k, v) => { nd.append(el('dt', '', k), el('dd', '', v)); };
      r2('tool', note.tool);
      r2('exit', note.exit + (note.timed_out ? ' (timed out)' : ''));
      r2('took', secs(note.duration_ns / 1e9));
      parts.push(nd, el('div', 'muted', 'command' + (note.cmd_cut ? ' (cut)' : '')), el('pre', 'cmd', note.cmd || '(none)'));
      if (note.stdout) parts.push(el('div', 'muted', 'stdout (head)'), el('pre', 'stdout', note.stdout));
      if (note.stderr) parts.push(el('div', 'muted', 'stderr (head)'), el('pre', 'stderr', note.stderr));
    } else {
      parts.push(el('p', 'muted', n.kind === 'none' ? '' : 'No turn recorded for this state (a reset, a branch point, or made before the server started).'));
    }
    // Diff: pick this node as the first state, then another as the
    // second.
    const bar = el('div', 'diff-pick');
    const pickA = el('button', 'diff-a', ui.diffA === n.id ? 'first state of the diff' : 'diff from here');
    pickA.id = 'diff-from';
    pickA.addEventListener('click', () => { ui.diffA = n.id; renderTree(); });
    bar.append(pickA);
    const a = ui.diffA && ui.tree.nodes.get(ui.diffA);
    if (a && a.id !== n.id) {
      const to = el('button', 'diff-b', 'diff ' + short(a.state) + ' → ' + short(n.state));
      to.id = 'diff-to';
      to.addEventListener('click', () => showDiff(a, n).catch(showDiffError));
      bar.append(to);
    }
    parts.push(bar);
    if (!ui.scope || ui.scope.env !== n.env) {
      const b = el('button', '', 'tree of env ' + short(n.env));
      b.addEventListener('click', () => setScope({ env: n.env }));
      parts.push(b);
    }
    box.replaceChildren(...parts);
  }

  // ---- diff of two states -----------------------------------------------

  async function showDiff(a, b) {
    const sec = $('diff-sec');
    sec.hidden = false;
    $('diff-title').textContent = a.state + ' → ' + b.state;
    $('diff').replaceChildren(el('p', 'muted', 'comparing…'));
    const d = await getJSON('/ui/api/diff?a=' + encodeURIComponent(a.state) + '&b=' + encodeURIComponent(b.state));
    renderDiff(d);
  }

  function showDiffError(err) {
    $('diff').replaceChildren(el('p', 'diff-error', String(err.message || err)));
  }

  function renderDiff(d) {
    const parts = [];
    const sh = d.shell || {};
    const shell = el('dl', 'diff-shell');
    const row = (k, v) => { shell.append(el('dt', '', k), el('dd', '', v)); };
    row('working directory', sh.cwd_a === sh.cwd_b ? (sh.cwd_a || '(not recorded)') + ' (unchanged)' : (sh.cwd_a || '?') + ' → ' + (sh.cwd_b || '?'));
    if (sh.note) row('shell', sh.note);
    parts.push(el('h3', '', 'shell'), shell);
    if (sh.diff) parts.push(diffPre(sh.diff));
    parts.push(el('h3', '', d.changed + ' path' + (d.changed === 1 ? '' : 's') + ' changed' + (d.truncated ? ' (cut at the diff’s bounds)' : '')));
    const list = el('div', 'diff-files');
    for (const f of d.files) {
      const box = el('div', 'diff-file change-' + f.change);
      box.dataset.path = f.path;
      box.dataset.change = f.change;
      const head = el('div', 'diff-head');
      head.append(el('span', 'diff-kind', f.change), ' ', el('span', 'diff-path', f.path));
      const what = [];
      const types = [f.type_a, f.type_b].filter(Boolean);
      if (types.length === 2 && types[0] !== types[1]) what.push(types[0] + ' → ' + types[1]);
      else if (types.length && types[0] !== 'file') what.push(types[0]);
      if (f.link_a || f.link_b) what.push('link ' + (f.link_a || '∅') + ' → ' + (f.link_b || '∅'));
      if (f.binary) { box.dataset.binary = '1'; what.push('binary, ' + bytes(f.size_a) + ' → ' + bytes(f.size_b)); }
      if (f.note && !f.binary) what.push(f.note);
      if (what.length) head.append(' ', el('span', 'muted', '(' + what.join('; ') + ')'));
      box.append(head);
      if (f.diff) box.append(diffPre(f.diff));
      list.append(box);
    }
    parts.push(list);
    $('diff').replaceChildren(...parts);
  }

  // diffPre shows a unified diff, each line as text with its class.
  function diffPre(text) {
    const pre = el('pre', 'udiff');
    for (const line of text.replace(/\n$/, '').split('\n')) {
      const c = line.startsWith('+++') || line.startsWith('---') ? 'meta' : line.startsWith('@@') ? 'hunk' :
        line[0] === '+' ? 'add' : line[0] === '-' ? 'del' : '';
      pre.append(el('span', c, line + '\n'));
    }
    return pre;
  }

  // headNode is the node the env's head marker is on.
  function headNode(env) {
    for (const n of ui.tree.nodes.values()) if (n.heads && n.heads.includes(env)) return n;
    return null;
  }

  // onTurn adds a turn to the tree in place: a new state, or a turn
  // without checkpoint after the env's head; the head marker moves.
  function onTurn(ev) {
    const e = ui.envs.get(ev.env);
    if (e) {
      Object.assign(e, { turn: ev.turn, head: ev.state, idle_s: 0, seenAt: performance.now(), last: ev.note });
      updateEnvRow(ev.env);
    }
    const t = ui.tree;
    if (!t || !t.envs.has(ev.env)) {
      if (ui.scope && ui.scope.task && ev.task === ui.scope.task) scheduleTreeReload();
      return;
    }
    const prev = headNode(ev.env) || t.nodes.get(ev.parent);
    const none = ev.kind === 'none';
    const id = none ? ev.state + '~' + ev.env + '~' + ev.turn : ev.state;
    if (t.nodes.has(id)) return;
    const n = { id, state: ev.state, env: ev.env, turn: ev.turn, kind: ev.kind, status: 'live', note: ev.note, created: ev.time, heads: [ev.env] };
    if (prev) {
      n.parent = prev.id;
      n.branch = prev.env !== ev.env;
      prev.heads = (prev.heads || []).filter((h) => h !== ev.env);
    }
    t.nodes.set(id, n);
    renderTree();
  }

  // onEvaluate puts an evaluation's reward on its state's node in place.
  function onEvaluate(ev) {
    const n = ui.tree && ev.state && ui.tree.nodes.get(ev.state);
    if (n && ev.reward !== undefined) {
      n.reward = ev.reward;
      renderTree();
    } else if (ui.tree && touches(ev)) scheduleTreeReload();
  }

  function touches(ev) {
    const t = ui.tree;
    if (!t) return false;
    if (ui.scope.task && ev.task === ui.scope.task) return true;
    return [ev.env, ev.child, ...(ev.children || [])].some((id) => id && t.envs.has(id));
  }

  // ---- health -----------------------------------------------------------

  function card(k, v, sub, alert) {
    const c = el('div', 'card' + (alert ? ' alert' : ''));
    const vv = el('div', 'v', v);
    if (sub) vv.append(' ', el('span', 'sub', sub));
    c.append(el('div', 'k', k), vv);
    return c;
  }

  function renderHealth(h) {
    const cp = h.checkpoints || {};
    const kinds = el('div', 'card');
    kinds.append(el('div', 'k', 'checkpoints by kind'));
    const kv = el('div', 'v');
    for (const k of ['none', 'fs', 'proc', 'full']) {
      const chip = el('span', 'chip');
      chip.dataset.kind = k;
      chip.append(el('span', 'sw kind-' + k), ' ' + k + ' ', el('b', '', cp[k] || 0));
      kv.append(chip);
    }
    kinds.append(kv);
    const share = h.checkpoint_seconds > 0 ? (100 * h.exposed_seconds / h.checkpoint_seconds).toFixed(1) + '% of ' + secs(h.checkpoint_seconds) : 'of 0 s';
    const misses = (h.verified && h.verified.miss) || 0;
    const verrors = (h.verified && h.verified.error) || 0;
    const cards = [
      kinds,
      card('exposed checkpoint time', secs(h.exposed_seconds || 0), share),
      card('queue depth', (h.queue_low + h.queue_high) + '', `low ${h.queue_low} · high ${h.queue_high} · running ${h.queue_running}/${h.queue_workers}`),
      card('image cache hot', bytes(h.image_hot_bytes), `${h.image_hot} images of ${bytes(h.image_capacity)} · ${h.image_hits} hits`),
      card('image cache cold', bytes(h.image_cold_bytes), `${h.image_cold} images · ${h.image_misses} loads back`),
      card('warm copies', h.warm_copies + '', `${h.prepared_copies || 0} prepared`),
      card('verification misses', misses + '', `${(h.verified && h.verified.ok) || 0} ok · ${verrors} could not run`, misses + verrors > 0),
      card('states', h.states + '', `${h.active_envs} envs open`),
    ];
    for (const d of h.disk || []) {
      cards.push(card('disk ' + d.name, d.total ? (100 * d.used / d.total).toFixed(0) + '%' : '-', bytes(d.used) + ' of ' + bytes(d.total), d.over));
    }
    cards.forEach((c, i) => { c.dataset.metric = ['kinds', 'exposed', 'queue', 'hot', 'cold', 'warm', 'misses', 'states'][i] || 'disk'; });
    // Admission control's queues (docs/ui.md): waiting now, running of
    // the slots, the recent wait, and the busy answers since start.
    for (const a of h.admission || []) {
      const c = card('admit ' + a.class, a.queued + ' waiting',
        `running ${a.running}/${a.slots} · wait ${secs(a.wait_s || 0)} · ${a.busy} busy`, a.queued > a.slots);
      c.dataset.metric = 'admit-' + a.class;
      cards.push(c);
    }
    $('health').replaceChildren(...cards);
  }

  // ---- live feed --------------------------------------------------------

  function showError(err) {
    const c = $('conn');
    c.textContent = String(err.message || err);
    c.classList.add('off');
  }

  async function resync() {
    await loadEnvs();
    await loadTree();
  }

  function connect() {
    const es = new EventSource('/ui/api/events');
    let lost = false;
    const on = (type, f) => es.addEventListener(type, (m) => {
      try { f(JSON.parse(m.data)); } catch (err) { showError(err); }
    });
    es.addEventListener('open', () => {
      $('conn').textContent = 'live';
      $('conn').classList.remove('off');
      if (lost) resync().catch(showError);
      lost = false;
    });
    es.addEventListener('error', () => {
      $('conn').textContent = 'reconnecting';
      $('conn').classList.add('off');
      lost = true;
    });
    on('health', renderHealth);
    on('turn', onTurn);
    on('evaluate', onEvaluate);
    for (const type of ['reset', 'branch', 'rollback', 'promote', 'discard', 'close', 'finish']) {
      on(type, (ev) => {
        loadEnvs().catch(showError);
        if (touches(ev)) scheduleTreeReload();
      });
    }
    // The server dropped this stream: it fell behind. It ends the stream
    // and EventSource reconnects; the open handler reloads.
    on('resync', () => { lost = true; });
    ui.events = es;
  }

  // A handle for tests and the console: the layout and a way to draw a
  // given tree (docs/ui.md).
  window.arborUI = { layout, setTree, reload: resync, state: ui, showDiff };

  window.addEventListener('hashchange', applyScope);
  $('task-pick').addEventListener('change', (e) => { if (e.target.value) setScope({ task: e.target.value }); });
  setInterval(tickIdle, 1000);
  connect();
  loadEnvs().then(applyScope).catch(showError);
})();
