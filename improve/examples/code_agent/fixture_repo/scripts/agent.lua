-- The agent: an explorer proposes commands, an evaluator keeps
-- what matters and is the only one that may answer.
local M = {}

local MAX_TURNS = 10
local MAX_CYCLES = 6
local MAX_OUTPUT = 10000

local function build_prompt(state, task, outputs)
  local parts = { "Task: " .. task }
  for _, out in ipairs(outputs) do
    table.insert(parts, out.cmd .. "\n" .. out.content)
  end
  return table.concat(parts, "\n")
end

function M.run_state_machine(opts)
  local turn = 0
  local state = "explorer"
  while turn < (opts.max_turns or MAX_TURNS) do
    turn = turn + 1
    local prompt = build_prompt(state, opts.task, {})
    state = (state == "explorer") and "evaluator" or "explorer"
  end
  return { success = false, reason = "max_turns", turns = turn }
end

function M.is_looping(recent_cmds, n)
  n = n or 3
  if #recent_cmds < n then return false end
  local last = recent_cmds[#recent_cmds]
  for i = 1, n - 1 do
    if recent_cmds[#recent_cmds - i] ~= last then return false end
  end
  return true
end

function M.show_help()
  print("tern agent <question>")
end

return M
