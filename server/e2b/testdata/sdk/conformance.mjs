// Arbor's E2B-compatible API driven by the official E2B JS SDK (run by
// server/e2b/sdk_test.go). The SDK is pointed at Arbor with its own
// documented environment variables only: E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY. Each case prints "ok NAME" or "FAIL NAME: why".
import {
  Sandbox, CommandExitError, TimeoutError, NotFoundError, SandboxNotFoundError,
  FileNotFoundError, AuthenticationError, SandboxError,
} from 'e2b'

const [template] = process.argv.slice(2)
const api = process.env.E2B_API_URL
const key = process.env.E2B_API_KEY

let failed = 0
async function check(name, fn) {
  try {
    await fn()
    console.log(`ok ${name}`)
  } catch (e) {
    failed++
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack.split('\n').slice(0, 3).join(' | ') : e}`)
  }
}
function eq(got, want, what) {
  if (JSON.stringify(got) !== JSON.stringify(want)) {
    throw new Error(`${what}: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`)
  }
}
async function rejects(p, cls, what) {
  try {
    await p
  } catch (e) {
    if (!(e instanceof cls)) throw new Error(`${what}: got ${e && e.constructor && e.constructor.name}: ${e && e.message}, want ${cls.name}`)
    return e
  }
  throw new Error(`${what}: no error, want ${cls.name}`)
}
// ext calls one of Arbor's extension endpoints (docs/e2b.md).
async function ext(method, path, body) {
  const res = await fetch(api + path, {
    method, headers: { 'X-API-KEY': key, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await res.text()
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`)
  return text ? JSON.parse(text) : null
}

const sbx = await Sandbox.create(template, { metadata: { run: 'conformance' } })

await check('create', async () => {
  const info = await sbx.getInfo()
  eq(info.sandboxId, sbx.sandboxId, 'sandboxId')
  eq(info.templateId, template, 'templateId')
  eq(info.state, 'running', 'state')
  eq(info.metadata, { run: 'conformance' }, 'metadata')
  const listed = await Sandbox.list({ query: { metadata: { run: 'conformance' } } }).nextItems()
  if (!listed.some((s) => s.sandboxId === sbx.sandboxId)) throw new Error(`list: ${sbx.sandboxId} missing from ${JSON.stringify(listed)}`)
  if (!(await sbx.isRunning())) throw new Error('isRunning: false')
})

await check('command foreground', async () => {
  const r = await sbx.commands.run('echo hello; echo oops >&2')
  eq([r.exitCode, r.stdout, r.stderr], [0, 'hello\n', 'oops\n'], 'result')
})

await check('command env and cwd', async () => {
  const r = await sbx.commands.run('echo "$GREETING $(pwd)"', { envs: { GREETING: 'hi' }, cwd: '/tmp' })
  eq(r.stdout, 'hi /tmp\n', 'stdout')
})

await check('sandbox envs and timeout', async () => {
  const s = await Sandbox.create(template, { envs: { FROM_CREATE: 'yes', B: 'b' }, timeoutMs: 2000 })
  eq((await s.commands.run('echo $FROM_CREATE $B', { envs: { B: 'own' } })).stdout, 'yes own\n', 'envs')
  await s.setTimeout(60000)
  await new Promise((r) => setTimeout(r, 2500))
  eq((await s.getInfo()).state, 'running', 'extended')
  await s.setTimeout(1000)
  await new Promise((r) => setTimeout(r, 1500))
  await rejects(s.getInfo(), SandboxNotFoundError, 'past its timeout')
})

await check('command streaming callbacks', async () => {
  const out = []
  const err = []
  const r = await sbx.commands.run('for i in 1 2 3; do echo line$i; done; echo e >&2', {
    onStdout: (d) => out.push(d), onStderr: (d) => err.push(d),
  })
  eq(out.join(''), 'line1\nline2\nline3\n', 'onStdout')
  eq(err.join(''), 'e\n', 'onStderr')
  eq(r.stdout, out.join(''), 'stdout')
})

await check('command non-zero exit', async () => {
  const e = await rejects(sbx.commands.run('echo partial; exit 3'), CommandExitError, 'exit 3')
  eq([e.exitCode, e.stdout], [3, 'partial\n'], 'error')
})

await check('command not found', async () => {
  const e = await rejects(sbx.commands.run('no-such-command-e2b'), CommandExitError, 'missing command')
  eq(e.exitCode, 127, 'exitCode')
  if (!e.stderr.includes('not found')) throw new Error(`stderr: ${e.stderr}`)
})

await check('command timeout', async () => {
  await rejects(sbx.commands.run('sleep 10', { timeoutMs: 1500 }), TimeoutError, 'timeout')
  // The sandbox goes on.
  eq((await sbx.commands.run('echo after')).stdout, 'after\n', 'after a timeout')
})

await check('command background', async () => {
  const h = await sbx.commands.run('sleep 2; echo bg', { background: true })
  if (typeof h.pid !== 'number') throw new Error(`pid: ${h.pid}`)
  const got = []
  const c = await sbx.commands.connect(h.pid, { onStdout: (d) => got.push(d) })
  const r = await h.wait()
  eq(r.stdout, 'bg\n', 'background stdout')
  eq((await c.wait()).stdout, 'bg\n', 'connected stdout')
  eq(got.join(''), 'bg\n', 'connected onStdout')
  await rejects(sbx.commands.connect(h.pid), NotFoundError, 'connect to an ended command')
})

await check('command background kill', async () => {
  const h = await sbx.commands.run('sleep 30', { background: true })
  const listed = await sbx.commands.list()
  if (!listed.some((p) => p.pid === h.pid)) throw new Error(`list: ${JSON.stringify(listed)} lacks ${h.pid}`)
  // Another handle on the running command (commands.connect).
  const again = await sbx.commands.connect(h.pid)
  eq(again.pid, h.pid, 'connect pid')
  eq(await h.kill(), true, 'kill')
  const e2 = await rejects(again.wait(), CommandExitError, 'killed command, connected')
  eq(e2.exitCode, -1, 'killed, connected')
  // Killed, not ended: sleep 30 would have exited 0.
  const e = await rejects(h.wait(), CommandExitError, 'killed command')
  eq([e.exitCode, e.error], [-1, 'signal: killed'], 'killed')
  eq(await sbx.commands.kill(h.pid), false, 'kill of an ended command')
  eq((await sbx.commands.run('echo alive')).stdout, 'alive\n', 'after a kill')
})

await check('files write read list', async () => {
  const w = await sbx.files.write('/tmp/e2b/a.txt', 'hello file\n')
  eq([w.name, w.path], ['a.txt', '/tmp/e2b/a.txt'], 'write info')
  eq(await sbx.files.read('/tmp/e2b/a.txt'), 'hello file\n', 'read')
  await sbx.files.write([{ path: '/tmp/e2b/b.txt', data: 'b' }, { path: '/tmp/e2b/c.txt', data: 'c' }])
  const names = (await sbx.files.list('/tmp/e2b')).map((e) => `${e.name}:${e.type}`).sort()
  eq(names, ['a.txt:file', 'b.txt:file', 'c.txt:file'], 'list')
  const info = await sbx.files.getInfo('/tmp/e2b/a.txt')
  eq([info.type, info.size, info.name], ['file', 11, 'a.txt'], 'getInfo')
  eq(await sbx.files.exists('/tmp/e2b/nope'), false, 'exists of a missing file')
  eq(await sbx.files.makeDir('/tmp/e2b/d'), true, 'makeDir')
  eq(await sbx.files.makeDir('/tmp/e2b/d'), false, 'makeDir of an existing dir')
  eq((await sbx.files.getInfo('/tmp/e2b/d')).type, 'dir', 'dir type')
  const moved = await sbx.files.rename('/tmp/e2b/b.txt', '/tmp/e2b/d/b2.txt')
  eq(moved.path, '/tmp/e2b/d/b2.txt', 'rename')
  eq(await sbx.files.read('/tmp/e2b/d/b2.txt'), 'b', 'read renamed')
  await sbx.files.remove('/tmp/e2b/d')
  eq(await sbx.files.exists('/tmp/e2b/d'), false, 'removed')
  await rejects(sbx.files.read('/tmp/e2b/missing'), FileNotFoundError, 'read of a missing file')
  // The command side sees the file side.
  eq((await sbx.commands.run('cat /tmp/e2b/c.txt')).stdout, 'c', 'cat')
  const bytes = await sbx.files.read('/tmp/e2b/a.txt', { format: 'bytes' })
  eq(bytes.length, 11, 'bytes')
})

await check('files large', async () => {
  const line = 'abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ-.,:;!?\n'
  const big = line.repeat(Math.ceil((5 << 20) / line.length)).slice(0, 5 << 20)
  await sbx.files.write('/tmp/big.txt', big)
  eq((await sbx.files.getInfo('/tmp/big.txt')).size, 5 << 20, 'size')
  const back = await sbx.files.read('/tmp/big.txt')
  if (back !== big) throw new Error(`read back ${back.length} bytes, not the ${big.length} written`)
  eq((await sbx.commands.run('wc -c < /tmp/big.txt')).stdout.trim(), String(5 << 20), 'wc')
})

await check('fork live into 4 that diverge', async () => {
  await sbx.files.write('/tmp/fork.txt', 'parent')
  await sbx.commands.run('sleep 1000 >/dev/null 2>&1 & echo $! > /tmp/sleeper.pid')
  const forks = await sbx.fork({ count: 4 })
  eq(forks.length, 4, 'count')
  for (const f of forks) if (!(f instanceof Sandbox)) throw new Error(`a fork failed: ${f}`)
  const ids = new Set(forks.map((f) => f.sandboxId))
  if (ids.size !== 4 || ids.has(sbx.sandboxId)) throw new Error(`ids: ${[...ids]}`)
  await Promise.all(forks.map((f, i) => f.commands.run(`echo child${i} >> /tmp/fork.txt`)))
  for (const [i, f] of forks.entries()) {
    eq(await f.files.read('/tmp/fork.txt'), `parentchild${i}\n`, `child ${i}`)
    // The live process came along.
    eq((await f.commands.run('kill -0 $(cat /tmp/sleeper.pid) && echo running')).stdout, 'running\n', `child ${i} process`)
  }
  eq(await sbx.files.read('/tmp/fork.txt'), 'parent', 'parent unchanged')
  await Promise.all(forks.map((f) => f.kill()))
})

await check('fork from a past state and roll back', async () => {
  await sbx.files.write('/tmp/v.txt', 'v1')
  const { head: v1 } = await ext('GET', `/sandboxes/${sbx.sandboxId}/states`)
  await sbx.files.write('/tmp/v.txt', 'v2')
  const { states } = await ext('GET', `/sandboxes/${sbx.sandboxId}/states`)
  if (!states.some((s) => s.stateID === v1)) throw new Error(`lineage lacks ${v1}`)
  const [res] = await ext('POST', `/sandboxes/${sbx.sandboxId}/fork`, { count: 1, stateID: v1 })
  const past = await Sandbox.connect(res.sandbox.sandboxID)
  eq(await past.files.read('/tmp/v.txt'), 'v1', 'fork of the past state')
  eq(await sbx.files.read('/tmp/v.txt'), 'v2', 'source unchanged')
  // Any state by id alone, too.
  const [res2] = await ext('POST', '/sandboxes/fork', { count: 1, stateID: v1 })
  const past2 = await Sandbox.connect(res2.sandbox.sandboxID)
  eq(await past2.files.read('/tmp/v.txt'), 'v1', 'fork by state id')
  await ext('POST', `/sandboxes/${sbx.sandboxId}/rollback`, { stateID: v1 })
  eq(await sbx.files.read('/tmp/v.txt'), 'v1', 'rolled back')
  await past.kill()
  await past2.kill()
})

await check('snapshot', async () => {
  await sbx.files.write('/tmp/snap.txt', 'at snapshot')
  const snap = await sbx.createSnapshot()
  eq(snap.names, [snap.snapshotId], 'names')
  await sbx.files.write('/tmp/snap.txt', 'after')
  const s = await Sandbox.create(snap.snapshotId)
  eq(await s.files.read('/tmp/snap.txt'), 'at snapshot', 'sandbox of the snapshot')
  eq(await sbx.files.read('/tmp/snap.txt'), 'after', 'source runs on')
  await s.kill()
})

await check('pause and resume', async () => {
  await sbx.files.write('/tmp/p.txt', 'before pause')
  eq(await sbx.pause(), true, 'pause')
  eq(await sbx.pause(), false, 'pause again')
  eq((await sbx.getInfo()).state, 'paused', 'state')
  eq(await sbx.isRunning(), false, 'isRunning when paused')
  const paused = (await Sandbox.list({ query: { state: ['paused'] } }).nextItems()).map((s) => s.sandboxId)
  if (!paused.includes(sbx.sandboxId)) throw new Error(`list paused: ${paused}`)
  // The SDK's classes for a sandbox not running: a command's start
  // answered unavailable, a file call's 502.
  await rejects(sbx.commands.run('echo no'), SandboxNotFoundError, 'command on a paused sandbox')
  await rejects(sbx.files.read('/tmp/p.txt'), TimeoutError, 'file read on a paused sandbox')
  // Fork a paused sandbox (E2B cannot).
  const [child] = await Sandbox.fork(sbx.sandboxId, { count: 1 })
  if (!(child instanceof Sandbox)) throw new Error(`fork of a paused sandbox: ${child}`)
  eq(await child.files.read('/tmp/p.txt'), 'before pause', 'child of the paused state')
  await child.kill()
  const again = await Sandbox.connect(sbx.sandboxId)
  eq((await again.getInfo()).state, 'running', 'resumed')
  eq(await again.files.read('/tmp/p.txt'), 'before pause', 'after resume')
})

await check('errors', async () => {
  await rejects(Sandbox.connect('no-such-sandbox'), SandboxNotFoundError, 'connect unknown sandbox')
  await rejects(Sandbox.getInfo('no-such-sandbox'), SandboxNotFoundError, 'getInfo unknown sandbox')
  eq(await Sandbox.kill('no-such-sandbox'), false, 'kill unknown sandbox')
  const e = await rejects(Sandbox.create('no-such-template-e2b'), SandboxError, 'bad template')
  if (!/404|400/.test(e.message)) throw new Error(`bad template: ${e.message}`)
  await rejects(Sandbox.create(template, { apiKey: 'wrong-key' }), AuthenticationError, 'wrong API key')
  await rejects(Sandbox.fork('no-such-sandbox', { count: 1 }), NotFoundError, 'fork unknown sandbox')
})

await check('kill', async () => {
  eq(await sbx.kill(), true, 'kill')
  await rejects(Sandbox.getInfo(sbx.sandboxId), SandboxNotFoundError, 'getInfo after kill')
  eq(await Sandbox.kill(sbx.sandboxId), false, 'kill again')
  eq(await sbx.isRunning(), false, 'isRunning after kill')
  await rejects(sbx.commands.run('echo gone'), SandboxError, 'command after kill')
})

process.exit(failed ? 1 : 0)
