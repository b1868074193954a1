-- A small todo list kept in .tern/todo.txt.
local M = {}

local FILE = ".tern/todo.txt"

local function read_lines()
  local lines = {}
  for line in io.lines(FILE) do table.insert(lines, line) end
  return lines
end

function M.add(text)
  local f = io.open(FILE, "a")
  f:write(text .. "\n")
  f:close()
end

function M.list()
  for i, line in ipairs(read_lines()) do print(i .. ". " .. line) end
end

function M.done(index)
  local lines = read_lines()
  table.remove(lines, index)
  local f = io.open(FILE, "w")
  f:write(table.concat(lines, "\n"))
  f:close()
end

function M.clear()
  io.open(FILE, "w"):close()
end

return M
