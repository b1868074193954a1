// Driver for bench/xstate_node.py: one JSON document in on stdin, one out on stdout.
//
// mode "conform": fold each thread's events through the hosted machine with XState's pure
// `initialTransition` / `transition`, recording the state and status after each event, the final
// context and output. Named guards are answered from the verdicts the Python interpreter gave on the
// same thread (keyed by guard, params, context and event), so a guard XState asks on a context
// Python never reached is a difference, not a guess. With `bindInput` (a policy, whose guards read
// its input), a machine is made per thread with the thread's input bound.
// mode "bench": time the same folds, `repeat` times after `warmup` untimed passes; events = the init
// plus every event folded.
// mode "serve": the "bench" payload on the first line of stdin, `warmup` untimed passes, then one line
// `{"events": n}` out; after that each line in ("pass") times one more pass and answers
// `{"seconds": s}`, until stdin closes. The caller times its own side between passes, so the two
// sides interleave pass by pass in one process each.

import { initialTransition, transition } from 'xstate'
import { hostMachine, fromLog, toJson } from './host.mjs'

function canonical (v) {
  if (Array.isArray(v)) return '[' + v.map(canonical).join(',') + ']'
  if (v !== null && typeof v === 'object') {
    return '{' + Object.keys(v).sort().filter((k) => v[k] !== undefined)
      .map((k) => JSON.stringify(k) + ':' + canonical(v[k])).join(',') + '}'
  }
  return JSON.stringify(v)
}

function namedGuardTypes (exported) {
  const types = new Set()
  const visit = (node) => {
    if (Array.isArray(node)) node.forEach(visit)
    else if (node !== null && typeof node === 'object') {
      if (node.guard && typeof node.guard === 'object' && node.guard.type !== 'cel') types.add(node.guard.type)
      Object.values(node).forEach(visit)
    }
  }
  visit(exported.states)
  return [...types]
}

function invokeIdOf (exported, snapshot) {
  return exported.states[snapshot.value]?.invoke?.id
}

// An expression that throws while XState computes the initial state comes back as `status: 'error'`
// with the Error as `snapshot.error` (`transition` throws it), where the interpreter raises. Thrown
// again here, both read as a failure at that event.
function checked (snap) {
  if (snap.status === 'error' && snap.error instanceof Error) throw snap.error
  return snap
}

function fold (machine, exported, thread, steps) {
  let [snap] = initialTransition(machine, thread.input)
  steps?.push([checked(snap).value, snap.status])
  for (const event of thread.events) {
    // An actor delivers nothing to a machine that has finished; the interpreter ignores it too.
    if (snap.status === 'active') [snap] = transition(machine, snap, fromLog(event, invokeIdOf(exported, snap)))
    steps?.push([checked(snap).value, snap.status])
  }
  return snap
}

function conform (payload) {
  const exported = payload.machine
  let table = {}
  const guards = {}
  for (const type of namedGuardTypes(exported)) {
    guards[type] = (context, event, params) => {
      const verdict = table[canonical([type, params, context, event])]
      if (verdict === undefined) throw new Error(`named guard '${type}' asked where the Python run never asked it`)
      return verdict
    }
  }
  const shared = payload.bindInput ? null : hostMachine(exported, { guards })
  const threads = []
  for (const thread of payload.threads) {
    table = thread.guards ?? {}
    const machine = shared ?? hostMachine(exported, { guards, input: thread.input })
    const steps = []
    const out = { id: thread.id, steps }
    try {
      const snap = fold(machine, exported, thread, steps)
      Object.assign(out, { context: toJson(snap.context), output: toJson(snap.output ?? null), status: snap.status })
    } catch (err) {
      out.failure = String(err && err.message ? err.message : err).split('\n')[0]
    }
    threads.push(out)
  }
  return { threads }
}

function bench (payload) {
  const exported = payload.machine
  const machine = hostMachine(exported)
  let events = 0
  for (const t of payload.threads) events += 1 + t.events.length
  const seconds = []
  // Untimed passes first, so V8 has compiled the hot paths (the peer at its best, not its start).
  for (let w = 0; w < (payload.warmup ?? 1); w++) for (const thread of payload.threads) fold(machine, exported, thread)
  for (let r = 0; r < payload.repeat; r++) {
    const start = process.hrtime.bigint()
    for (const thread of payload.threads) fold(machine, exported, thread)
    seconds.push(Number(process.hrtime.bigint() - start) / 1e9)
  }
  return { events, seconds }
}

async function serve (lines, first) {
  const payload = JSON.parse(first)
  const exported = payload.machine
  const machine = hostMachine(exported)
  let events = 0
  for (const t of payload.threads) events += 1 + t.events.length
  for (let w = 0; w < (payload.warmup ?? 1); w++) for (const thread of payload.threads) fold(machine, exported, thread)
  process.stdout.write(JSON.stringify({ events }) + '\n')
  for await (const line of lines) {
    if (line.trim() !== 'pass') throw new Error(`serve: expected "pass", got ${JSON.stringify(line.slice(0, 40))}`)
    const start = process.hrtime.bigint()
    for (const thread of payload.threads) fold(machine, exported, thread)
    process.stdout.write(JSON.stringify({ seconds: Number(process.hrtime.bigint() - start) / 1e9 }) + '\n')
  }
}

if (process.argv[2] === 'serve') {
  const { createInterface } = await import('node:readline')
  const lines = createInterface({ input: process.stdin, crlfDelay: Infinity })[Symbol.asyncIterator]()
  const first = await lines.next()
  await serve({ [Symbol.asyncIterator]: () => lines }, first.value)
} else {
  const chunks = []
  for await (const chunk of process.stdin) chunks.push(chunk)
  const payload = JSON.parse(Buffer.concat(chunks).toString('utf8'))
  const answer = payload.mode === 'bench' ? bench(payload) : conform(payload)
  process.stdout.write(JSON.stringify(answer))
}
