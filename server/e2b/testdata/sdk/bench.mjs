// The E2B SDK's side of BenchmarkSDK (server/e2b/bench_test.go): n rounds
// of create, a command round trip and fork(4) of a live sandbox; prints
// each operation's median in milliseconds ("NAME_ms VALUE").
import { Sandbox } from 'e2b'

const [template, rounds] = [process.argv[2], Number(process.argv[3] || 1)]
const took = { create: [], command: [], fork4: [] }
async function time(name, fn) {
  const t = performance.now()
  const r = await fn()
  took[name].push(performance.now() - t)
  return r
}
for (let i = 0; i < rounds; i++) {
  const sbx = await time('create', () => Sandbox.create(template))
  await sbx.commands.run('true')
  for (let j = 0; j < 5; j++) await time('command', () => sbx.commands.run('echo hi'))
  const forks = await time('fork4', () => sbx.fork({ count: 4 }))
  for (const f of forks) {
    if (!(f instanceof Sandbox)) throw f
    await f.kill()
  }
  await sbx.kill()
}
const median = (xs) => xs.sort((a, b) => a - b)[Math.floor(xs.length / 2)]
for (const [name, xs] of Object.entries(took)) console.log(`${name}_ms ${median(xs).toFixed(2)}`)
