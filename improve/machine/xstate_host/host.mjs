// The XState host for machines exported by `improve describe --format xstate`.
//
// The export keeps every expression a CEL string (context initialisers over `input`, guards of type
// `cel`, `xstate.assign` params, invoke input, final output), because that is what the Python
// interpreter runs. XState expects functions there; `hostMachine(exported)` supplies them, so the
// export runs in XState v5 with the interpreter's semantics (docs/xstate.md says what is the same
// and what is not). Dependencies, pinned in package.json next to this file: `xstate` and
// `@marcbachmann/cel-js`.
//
//   import { hostMachine, fromLog, toJson } from './host.mjs'
//   import { initialTransition, transition } from 'xstate'
//   const machine = hostMachine(exported)                  // the JSON `improve describe` writes
//   let [snap] = initialTransition(machine, { amount: 500, reason: 'broken' })
//   ;[snap] = transition(machine, snap, fromLog({ type: 'ESCALATE' }))
//   ;[snap] = transition(machine, snap, fromLog({ type: 'APPROVE' }))
//   snap.value                                             // 'issued'
//   toJson(snap.context).approved                          // true
//
// Numbers: CEL tells int from double, JSON and JavaScript do not. Values coming in (input, events,
// actor outputs) are read the way Python's json module reads them whenever the JSON text has no
// `.0`: a whole number is an int (BigInt inside CEL), any other a double. A whole double written as
// `90.0` therefore arrives as an int here and as a float in Python; values computed by CEL keep
// their type. `toJson` turns CEL values back into JSON ones (BigInt to Number) for the outside.

import { assign, fromPromise, setup } from 'xstate'
import { Environment } from '@marcbachmann/cel-js'

const DECIDE_SRC = 'agent.decide'
const FREE_TEXT = 'text'
const DONE = 'xstate.done.actor'
const ERROR = 'xstate.error.actor'

// The variables the Python allowlist admits (improve/machine/expr.py: ALLOWED_ROOTS); any other
// name is an error here as there.
const cel = new Environment({ homogeneousAggregateLiterals: false })
  .registerVariable('context', 'dyn')
  .registerVariable('event', 'dyn')
  .registerVariable('input', 'dyn')
  .registerVariable('facts', 'dyn')

const NO_INPUT = new Error('context: the machine reads `input`; start it with one')
const compiled = new Map()

/** A CEL expression compiled once per source text, as a function of the scope. Its errors name the
 * first place the source was compiled for (the same text elsewhere shares the function). */
function compile (source, where) {
  let fn = compiled.get(source)
  if (fn === undefined) {
    let parsed
    try {
      parsed = cel.parse(source)
    } catch (err) {
      throw new Error(`${where}: CEL does not parse: ${firstLine(err)}`)
    }
    fn = (scope) => {
      try {
        return parsed(scope)
      } catch (err) {
        throw new Error(`${where}: \`${source}\` failed: ${firstLine(err)}`)
      }
    }
    compiled.set(source, fn)
  }
  return fn
}

function firstLine (err) {
  return String(err && err.message ? err.message : err).split('\n')[0]
}

/** An expression tree (CEL strings inside objects and arrays; numbers, booleans, null literal). */
function compileTree (tree, where) {
  if (typeof tree === 'string') return compile(tree, where)
  if (Array.isArray(tree)) {
    const items = tree.map((t, i) => compileTree(t, `${where}[${i}]`))
    return (scope) => items.map((f) => f(scope))
  }
  if (tree !== null && typeof tree === 'object') {
    const entries = Object.entries(tree).map(([k, t]) => [k, compileTree(t, `${where}.${k}`)])
    return (scope) => Object.fromEntries(entries.map(([k, f]) => [k, f(scope)]))
  }
  const literal = toCel(tree)
  return () => literal
}

/** Whether an expression tree names `input` outside string literals. */
function treeReadsInput (tree) {
  if (typeof tree === 'string') return /\binput\b/.test(tree.replace(/'(?:\\.|[^'\\])*'|"(?:\\.|[^"\\])*"/g, "''"))
  if (tree !== null && typeof tree === 'object') return Object.values(tree).some(treeReadsInput)
  return false
}

/** A JSON value as CEL reads it: a whole number becomes an int (BigInt). */
export function toCel (value) {
  if (typeof value === 'number') return Number.isInteger(value) ? BigInt(value) : value
  if (Array.isArray(value)) return value.map(toCel)
  if (value !== null && typeof value === 'object') {
    if (typeof value === 'bigint' || value instanceof Map) return value
    const out = {}
    for (const [k, v] of Object.entries(value)) out[k] = toCel(v)
    return out
  }
  return value
}

/** A CEL value as JSON: ints (BigInt) and uints to Numbers, maps to objects. */
export function toJson (value) {
  if (typeof value === 'bigint') return Number(value)
  if (Array.isArray(value)) return value.map(toJson)
  if (value instanceof Map) return Object.fromEntries([...value].map(([k, v]) => [String(k), toJson(v)]))
  if (value !== null && typeof value === 'object') {
    if (value.constructor && value.constructor.name === 'UnsignedInteger') return Number(value.value)
    const out = {}
    for (const [k, v] of Object.entries(value)) out[k] = toJson(v)
    return out
  }
  return value
}

/** A log entry's event (`xstate.done.actor` with `actorId`) as XState delivers it. */
export function fromLog (event, invokeId) {
  const type = event.type
  if (type === DONE || type === ERROR) {
    const id = event.actorId ?? invokeId
    return { ...event, type: `${type}.${id}`, actorId: id }
  }
  return event
}

/** An XState event as the log spells it, which is what CEL and named guards read as `event`. */
export function toLog (event) {
  const type = event.type
  if (typeof type === 'string' && event.actorId !== undefined && (type.startsWith(`${DONE}.`) || type.startsWith(`${ERROR}.`))) {
    return { ...event, type: type.slice(0, type.length - event.actorId.length - 1) }
  }
  return event
}

// Events are converted once however many guards read them.
const celEvents = new WeakMap()
function celEvent (event) {
  if (event === null || typeof event !== 'object') return event
  let out = celEvents.get(event)
  if (out === undefined) {
    out = toCel(toLog(event))
    celEvents.set(event, out)
  }
  return out
}

/** The decision request an `agent.decide` invoke owes (improve/machine/interpreter.py: _decide_input). */
function compileDecide (input, where) {
  const name = compile(input.name, `${where}.name`)
  const payloads = Object.entries(input.payloads ?? {}).map(([ev, fields]) => [
    ev,
    Object.entries(fields).map(([fld, src]) => [fld, compile(src, `${where}.payloads.${ev}.${fld}`)])
  ])
  const facts = compileTree(input.facts ?? {}, `${where}.facts`)
  const prompt = input.prompt ? compile(input.prompt, `${where}.prompt`) : null
  return (s) => ({
    name: name(s),
    allowedEvents: [...input.allowedEvents],
    payloads: Object.fromEntries(
      payloads.map(([ev, fields]) => [
        ev,
        Object.fromEntries(
          fields.map(([fld, f]) => {
            const values = f(s)
            if (values === FREE_TEXT) return [fld, values]
            if (!Array.isArray(values)) throw new Error(`${where}.payloads.${ev}.${fld}: expected a list or '${FREE_TEXT}'`)
            return [fld, values.filter((v, i) => values.findIndex((w) => sameValue(v, w)) === i)]
          })
        )
      ])
    ),
    facts: facts(s),
    prompt: prompt ? prompt(s) : null
  })
}

function sameValue (a, b) {
  return JSON.stringify(toJson(a)) === JSON.stringify(toJson(b))
}

function transitionsOf (spec) {
  if (spec === undefined) return []
  return Array.isArray(spec) ? spec : [spec]
}

/**
 * An XState machine from an exported config.
 *
 * - `options.guards`: a named guard's implementation per type, `(context, event, params) => boolean`
 *   over JSON values (the Python host's signature).
 * - `options.actors`: actor logic per invoke `src`. A src without logic gets one that never settles:
 *   whoever drives the machine answers with `xstate.done.actor.<id>` / `xstate.error.actor.<id>`
 *   events (`fromLog` makes them from log entries), as the Python runner does.
 * - `options.input`: bound as `input` (and `input.facts` as `facts`) in every expression, not only in
 *   the context initialisers; a policy's guards read its decision request: one machine per request.
 */
export function hostMachine (exported, options = {}) {
  const config = structuredClone(exported)
  // XState keeps a machine's input only for its context initialiser.
  const bound = 'input' in options ? toCel(options.input) : undefined
  const scope = (context, event) => {
    const s = { context, event: celEvent(event) }
    if (bound !== undefined) {
      s.input = bound
      if (bound !== null && typeof bound === 'object' && bound.facts != null) s.facts = bound.facts
    }
    return s
  }
  const named = options.guards ?? {}
  const actors = { ...(options.actors ?? {}) }
  let outputs = false
  const contextInit = compileTree(config.context ?? {}, 'context')
  const readsInput = treeReadsInput(config.context ?? {})
  config.context = ({ input }) => {
    // XState builds a throwaway actor, without input, on every pure `transition` call: failing here
    // without asking CEL (whose errors format the source), with an Error made once (capturing a
    // stack each time cost a sixth of a transition), keeps that cost XState's own.
    if (input === undefined && readsInput) throw NO_INPUT
    const inp = toCel(input)
    const s = { input: inp, event: toCel({ type: 'xstate.init', input }) }
    if (inp !== null && typeof inp === 'object' && inp.facts != null) s.facts = inp.facts
    return contextInit(s)
  }
  for (const [name, state] of Object.entries(config.states ?? {})) {
    const where = `state '${name}'`
    const all = [
      ...Object.values(state.on ?? {}).flatMap(transitionsOf),
      ...transitionsOf(state.always),
      ...transitionsOf(state.invoke?.onDone),
      ...transitionsOf(state.invoke?.onError)
    ]
    for (const t of all) {
      const type = t.guard?.type
      if (type === 'cel') compile(t.guard.params.expr, `${where} guard`)
      else if (type !== undefined && !(type in named)) {
        throw new Error(`${where}: named guard '${type}' is not registered; pass it in options.guards`)
      }
    }
    if (state.invoke) {
      const inv = state.invoke
      inv.id ??= name // the interpreter's default invoke id; XState's own would be `machine.name[0]`
      const input = inv.src === DECIDE_SRC
        ? compileDecide(inv.input ?? {}, `${where}.invoke.input`)
        : compileTree(inv.input ?? {}, `${where}.invoke.input`)
      inv.input = ({ context, event }) => toJson(input(scope(context, event)))
      actors[inv.src] ??= fromPromise(() => new Promise(() => {}))
    }
    if (state.type === 'final' && state.output !== undefined) {
      const output = compileTree(state.output, `${where}.output`)
      // XState passes a root-level final state's output to the machine's output through the
      // done-state event; the event read here is the one that entered the state, as in Python.
      state.output = ({ context, event }) => output(scope(context, event))
      outputs = true
    }
  }
  if (outputs) config.output = ({ event }) => event.output
  const guards = {
    cel: ({ context, event }, params) => {
      const result = compile(params.expr, 'guard')(scope(context, event)) // compiled above, by state
      if (typeof result !== 'boolean') throw new Error(`guard \`${params.expr}\` returned ${result}, expected a bool`)
      return result
    }
  }
  for (const [type, fn] of Object.entries(named)) {
    guards[type] = ({ context, event }, params) => {
      const result = fn(toJson(context), toLog(event), params ?? {})
      if (typeof result !== 'boolean') throw new Error(`named guard '${type}' returned ${result}, expected a bool`)
      return result
    }
  }
  const assigns = new WeakMap() // params object -> its compiled tree
  const actions = {
    // Every value reads the context before the step, as in Python: one assign action per transition.
    'xstate.assign': assign(({ context, event }, params) => {
      let update = assigns.get(params)
      if (update === undefined) {
        update = compileTree(params, 'xstate.assign')
        assigns.set(params, update)
      }
      return update(scope(context, event))
    })
  }
  return setup({ guards, actions, actors }).createMachine(config)
}
