-- Runs once when tern starts: loads the other scripts.
package.path = "scripts/?.lua;" .. package.path

local agent = require("agent")
local todo = require("todo")

return { agent = agent, todo = todo }
